"""The env file `$IAS_DATA_DIR/ias.env`: KEY=VALUE lines that every command reads at start, below the real
environment (which overrides it); `ias setup` writes it, a systemd unit may name it as EnvironmentFile.

The syntax is the part that systemd's EnvironmentFile= and a shell agree on: `#` comment lines, blank
lines, `KEY=VALUE` with an optional `export ` before the key, the value bare (used as it is, without
its surrounding spaces) or in single quotes (literal) or double quotes (`\\"`, `\\\\` and `\\$` escaped).
Not handled: line continuations, variable expansion, a comment after a value, several values on a line.
A file that anyone but its owner may write, or owned by another user than this one or root, is refused:
it holds the API keys, and what it sets reaches every skill that asks for those variables.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .errors import ConfigError
from .limits import ENV_FILE_MAX

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPED = re.compile(r'\\(["\\$])')


def read(path: Path) -> dict[str, str]:
    """The settings in `path` ({} when it does not exist); a bad line or an unsafe file is a ConfigError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        check_owner(path, info)
        data = os.read(fd, ENV_FILE_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > ENV_FILE_MAX:
        raise ConfigError(f"{path}: larger than {ENV_FILE_MAX} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse(text, str(path))


def check_owner(path: Path, info: os.stat_result) -> None:
    """Refuse a file others may write: group/world writable, or owned by neither this user nor root."""
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path} is not a regular file")
    if info.st_uid not in (os.geteuid(), 0):
        raise ConfigError(f"{path} belongs to another user (uid {info.st_uid}): refused, as it sets the API keys; "
                          "chown it to this user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path} may be written by others (mode {stat.S_IMODE(info.st_mode):04o}): refused, "
                          f"as it sets the API keys; run chmod 600 {path}")


def parse(text: str, name: str = "ias.env") -> dict[str, str]:
    """KEY=VALUE lines as a dict (a later line wins); a bad line is a ConfigError naming `name:line`."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        entry = _entry(line)
        if isinstance(entry, str):
            raise ConfigError(f"{name}:{number}: {entry}")
        if entry is not None:
            values[entry[0]] = entry[1]
    return values


def _entry(line: str) -> tuple[str, str] | str | None:
    """(key, value) of one line, None for a blank or comment line, else the problem as text."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    key, equals, raw = stripped.partition("=")
    key = key.strip()
    if key.startswith("export ") or key.startswith("export\t"):
        key = key[len("export"):].strip()
    if not equals:
        return "not KEY=VALUE"
    if not _KEY.fullmatch(key):
        return f"{key[:40]!r} is not a variable name"
    raw = raw.strip()
    if raw[:1] in ("'", '"'):
        quote = raw[0]
        end = _closing(raw, quote)
        if end is None:
            return f"{key}: the value's {quote} is not closed"
        if raw[end + 1:].strip():
            return f"{key}: text after the closing {quote}"
        value = raw[1:end]
        return key, value if quote == "'" else _ESCAPED.sub(r"\1", value)
    if "\0" in raw:
        return f"{key}: a NUL character"
    return key, raw


def _closing(raw: str, quote: str) -> int | None:
    """The index of the quote that closes the one at raw[0] (a double quote may be escaped), or None."""
    i = 1
    while i < len(raw):
        if quote == '"' and raw[i] == "\\":
            i += 2
            continue
        if raw[i] == quote:
            return i
        i += 1
    return None


def quoted(value: str) -> str:
    """`value` as the env file writes it: bare when that reads back the same, else in double quotes."""
    if value and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    return '"' + re.sub(r'(["\\$])', r"\\\1", value) + '"'


def write(path: Path, settings: dict[str, str]) -> None:
    """Set `settings` in `path`, keeping its other lines: each key's first line replaced, its later ones
    dropped, new keys appended. Written to a temporary file (0600) and renamed over it: a reader sees the
    old file or the new one, never half of one. The directory is made when missing, as the other commands
    make it (mode from the umask: the postgres user of a root install must reach the cluster inside)."""
    for key, value in settings.items():
        if not _KEY.fullmatch(key) or "\n" in value or "\0" in value:
            raise ConfigError(f"cannot write {key} to {path}: not a variable name, or a value with a line break")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        old = []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    lines, done = [], set()
    for line in old:
        entry = _entry(line)
        key = entry[0] if isinstance(entry, tuple) else None
        if key in settings:
            if key not in done:
                lines.append(f"{key}={quoted(settings[key])}")
                done.add(key)
            continue
        lines.append(line)
    while lines and not lines[-1].strip():
        lines.pop()
    lines += [f"{key}={quoted(value)}" for key, value in settings.items() if key not in done]
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None

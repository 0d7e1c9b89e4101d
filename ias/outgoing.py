"""Files a skill sends the owner (SPEC 13, out): checked, copied out of the run, removed once nobody needs them.

A script skill's result may name files: `{"success": true, "files": [{"path": …, "caption": …}]}`.
Before the run's HOME is removed, the runner hands those entries to `take`, which copies each file
it allows into a private directory of its own under `$IAS_DATA_DIR/outgoing/` (0700; the copy 0600,
keeping the file's name), where the outbox finds it. Allowed: an absolute path inside the run's HOME
or the owner's inbox, reached without a symbolic link at any step below that root (each step opened
with O_NOFOLLOW relative to the one before, so a link planted by the skill is never followed, not even
by root), a regular file with no other hard link (a FIFO, device or directory is refused; opened non-blocking, so a FIFO
cannot stall the daemon) of at most MEDIA_SEND_MAX bytes, at most MEDIA_SEND_FILES_MAX per result.
A refused entry is a `Refused` fact; results.py tells the model why, and the call otherwise stands.

`facts` describes a file a `"format": "file"` parameter names, for the approval message (name, size,
SHA-256 prefix). `sweep` removes copies no queued message names any more once they are OUTGOING_KEEP
old (sent, expired, or left by a turn that failed). `own` is the outbox's check of a stored path
(database rows are hostile too): only a copy made here is ever sent.

Not handled: files from built-in handlers or MCP servers (only the script executor returns files);
a file that changes between the approval message and the run (the digest shown is the one read then).
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Sequence

from .limits import MEDIA_CAPTION_MAX, MEDIA_SEND_NAME_MAX, MEDIA_SEND_FILES_MAX, MEDIA_SEND_MAX, STDOUT_TO_LLM

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True, slots=True)
class OutFile:
    """A file on its way to the owner: the private copy, its name as the owner sees it, its size and caption."""
    path: str
    name: str
    size: int
    caption: str | None


@dataclass(frozen=True, slots=True)
class Refused:
    """A file a skill named that is not sent, and why: outside | missing | link | not_regular | too_big |
    too_many | bad_entry | failed (`count` entries alike, for too_many)."""
    path: str
    reason: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Facts:
    """What the approval message shows of a file parameter."""
    name: str
    size: int
    digest: str             # the first 12 hex digits of its SHA-256


class _Refusal(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def requested(stdout: str) -> list | None:
    """The `files` entries of a script's stdout when it is a successful JSON result naming some, else None."""
    try:
        result = json.loads(stdout)
    except (ValueError, RecursionError):
        return None
    if not isinstance(result, dict) or result.get("success") is not True:
        return None
    files = result.get("files")
    return files if isinstance(files, list) and files else None


async def collect(stdout: bytes, size: int, ended: bool, roots: Sequence[str | os.PathLike | None],
                  outgoing: str | os.PathLike | None) -> tuple[tuple[OutFile, ...], tuple[Refused, ...]]:
    """The runner's step before a run's HOME is removed: the files a run that `ended` well (exit 0) names
    in its JSON result taken (in a thread) from `roots`; nothing without `outgoing` or for a result the
    model reads as plain output (past STDOUT_TO_LLM bytes)."""
    entries = requested(stdout.decode("utf-8", "replace")) if outgoing and ended and size <= STDOUT_TO_LLM else None
    if entries is None:
        return (), ()
    return await asyncio.to_thread(take, entries, [root for root in roots if root is not None], outgoing)


def take(entries: list, roots: Sequence[str | os.PathLike], outgoing: str | os.PathLike) -> tuple[
        tuple[OutFile, ...], tuple[Refused, ...]]:
    """Copy the files `entries` name (inside one of `roots`) into `outgoing`: what was taken, what refused."""
    files: list[OutFile] = []
    refused: list[Refused] = []
    for entry in entries[:MEDIA_SEND_FILES_MAX]:
        path = entry.get("path") if isinstance(entry, dict) else None
        caption = entry.get("caption") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or not (caption is None or isinstance(caption, str)):
            refused.append(Refused(_shown(path if isinstance(path, str) else entry), "bad_entry"))
            continue
        try:
            files.append(_copy(path, caption, roots, outgoing))
        except _Refusal as exc:
            refused.append(Refused(_shown(path), exc.reason))
        except OSError as exc:
            log.warning("a file a skill returned could not be copied out (%s): %s", _shown(path), exc)
            refused.append(Refused(_shown(path), "failed"))
    if len(entries) > MEDIA_SEND_FILES_MAX:
        rest = entries[MEDIA_SEND_FILES_MAX]
        first = rest.get("path") if isinstance(rest, dict) else rest
        refused.append(Refused(_shown(first), "too_many", len(entries) - MEDIA_SEND_FILES_MAX))
    return tuple(files), tuple(refused)


def _shown(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:200]


def _copy(path: str, caption: str | None, roots: Sequence[str | os.PathLike], outgoing) -> OutFile:
    if "\0" in path or not os.path.isabs(path):
        raise _Refusal("outside")
    normal = os.path.normpath(path)
    for root in roots:
        steps = _below(normal, os.path.normpath(os.fspath(root)))
        if steps:
            break
    else:
        raise _Refusal("outside")
    fd = _open_below(root, steps)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refusal("not_regular")
        if info.st_nlink > 1:           # a hard link: maybe to a file of ours an unsandboxed skill could reach
            raise _Refusal("link")
        if info.st_size > MEDIA_SEND_MAX:
            raise _Refusal("too_big")
        name = safe_name(steps[-1])
        os.makedirs(outgoing, mode=0o700, exist_ok=True)
        box = os.path.join(outgoing, uuid.uuid4().hex)
        os.mkdir(box, 0o700)
        target = os.path.join(box, name)
        try:
            size = _write(fd, target)
        except BaseException:
            shutil.rmtree(box, ignore_errors=True)
            raise
    finally:
        os.close(fd)
    caption = caption.strip()[:MEDIA_CAPTION_MAX] if caption and caption.strip() else None
    return OutFile(target, name, size, caption)


def _below(path: str, root: str) -> list[str] | None:
    """The steps from `root` down to `path` (both normalised); None when `path` is not strictly below it."""
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    steps = [part for part in path[len(prefix):].split("/") if part]
    return steps or None


def _open_below(root, steps: list[str]) -> int:
    """`steps` below `root` opened one at a time without following a link; the file's descriptor."""
    try:
        current = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise _Refusal("missing") from None
    try:
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            try:
                following = os.open(step, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=current)
            except OSError as exc:
                raise _Refusal(_why(step, current, exc)) from None
            os.close(current)
            current = following
        return current
    except BaseException:
        os.close(current)
        raise


def _why(step: str, directory: int, exc: OSError) -> str:
    """Why a step could not be opened: a link, nothing there, or something else."""
    try:
        mode = os.lstat(step, dir_fd=directory).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    return "not_regular" if exc.errno in (errno.ENOTDIR, errno.ENXIO, errno.ELOOP) else "missing"


def _write(fd: int, target: str) -> int:
    """Copy what `fd` holds into a new 0600 file `target`, at most MEDIA_SEND_MAX bytes; its size."""
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    size = 0
    try:
        while chunk := os.read(fd, CHUNK):
            size += len(chunk)
            if size > MEDIA_SEND_MAX:        # it grew after the check
                raise _Refusal("too_big")
            os.write(out, chunk)
    finally:
        os.close(out)
    return size


def safe_name(name: str) -> str:
    """A file name fit to show and to send: no control or invisible characters, no slash, at most
    MEDIA_SEND_NAME_MAX characters (the extension kept)."""
    name = "".join("_" if unicodedata.category(c).startswith(("C", "Z")) and c != " " or c in "/\\" else c
                   for c in name).strip()
    if len(name) > MEDIA_SEND_NAME_MAX:
        stem, dot, ext = name.rpartition(".")
        ext = dot + ext if dot and len(ext) <= 10 else ""
        name = name[:MEDIA_SEND_NAME_MAX - len(ext)] + ext
    return name if name.strip(".") else "file"


def facts(value) -> Facts | None:
    """Name, size and SHA-256 prefix of the regular file (not a link) at absolute path `value`, of at most
    MEDIA_SEND_MAX bytes; None for anything else."""
    if not isinstance(value, str) or "\0" in value or not os.path.isabs(value):
        return None
    try:
        fd = os.open(value, _FILE_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MEDIA_SEND_MAX:
            return None
        digest = hashlib.sha256()
        size = 0
        while size <= MEDIA_SEND_MAX and (chunk := os.read(fd, CHUNK)):
            size += len(chunk)
            digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return Facts(os.path.basename(value), size, digest.hexdigest()[:12])


FILE_NOTE = "（文件 {size}，SHA-256 {digest}）"


def size_text(size: int) -> str:
    """A size as the owner and the model read it: 512 B, 123 KB, 4.5 MB."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def file_note(spec, value) -> str:
    """For the approval message (SPEC 13): after a string parameter declared `"format": "file"` that names a
    file (`facts`), its size and SHA-256 prefix (its name ends the path shown before); else nothing."""
    found = facts(value) if isinstance(spec, dict) and spec.get("format") == "file" else None
    return "" if found is None else FILE_NOTE.format(size=size_text(found.size), digest=found.digest)


def own(path: str, outgoing: str | os.PathLike) -> bool:
    """Whether `path` (a stored outbox row's) is a copy `take` made: a regular file, not a link, in a
    directory of its own right under `outgoing`."""
    if not isinstance(path, str) or "\0" in path:
        return False
    steps = _below(os.path.normpath(path), os.path.normpath(os.fspath(outgoing)))
    if steps is None or len(steps) != 2 or os.path.normpath(path) != path:
        return False
    try:
        return stat.S_ISDIR(os.lstat(os.path.dirname(path)).st_mode) and stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def discard(files: Sequence[OutFile]) -> None:
    """Remove copies nobody will send (the call's caller cannot deliver files)."""
    for item in files:
        shutil.rmtree(os.path.dirname(item.path), ignore_errors=True)


def sweep(outgoing: str | os.PathLike, named: set[str], now: float, keep: float) -> int:
    """Remove the copies under `outgoing` that no path in `named` is in, once older than `keep` seconds
    (by their directory's mtime against `now`, the wall clock); how many."""
    parents = {os.path.dirname(os.path.normpath(path)) for path in named}
    removed = 0
    try:
        entries = list(os.scandir(outgoing))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            old = entry.stat(follow_symlinks=False).st_mtime < now - keep
        except OSError:
            continue
        if old and entry.path not in parents:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed += 1
    return removed

"""Which data directory a command uses, and whether this process may use it (SPEC §11).

Run from a checkout that `ias service install` installed (the unit at UNIT_PATH names this
checkout's ias.py in ExecStart) with the data directory left at its default (no IAS_DATA_DIR, no
data_dir in ias.toml), a command uses the service's data directory (the unit's
`Environment=IAS_DATA_DIR=…`) instead of making a second, empty database in ./var. Root acting on a
data directory another user owns (the service's) becomes that user first (`setpriv`, an exec, not
a child), so that everything it writes there is the service's; where that cannot work, one line
says to use `sudo -u USER`. A data directory that is missing and cannot be made, or that this user
cannot write, is one line naming it and what to do (never `Permission denied` on pg.lock). An
existing directory is checked before the config is read, since the env file read with it lives
there and is refused to anyone but its owner.

Not handled: a unit installed elsewhere or written by hand (set IAS_DATA_DIR); several services
run from one checkout (the unit at UNIT_PATH wins); root's environment is kept across the switch
(as `sudo -E` would).
"""
from __future__ import annotations

import logging
import os
import pwd
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from . import config as config_module
from .config import REPO_ROOT, Config, absolute
from .errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT = "var"                         # Config's default data directory, relative to the working directory
# Where `service install` writes the unit, and where every command looks for it (here, not in `service`: every
# command reads it, and `service` imports what only an installation needs).
UNIT_PATH = Path("/etc/systemd/system/ias.service")


def service_data_dir(unit_path: Path, repo: Path = REPO_ROOT) -> Path | None:
    """The data directory of the service installed for the checkout `repo`, or None (no unit, another checkout's)."""
    try:
        text = unit_path.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        return None
    exec_start = data_dir = None
    for line in text.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "ExecStart":
            exec_start = value.split()
        elif key == "Environment" and value.startswith("IAS_DATA_DIR="):
            data_dir = value.partition("=")[2]
    if not exec_start or not data_dir or str(repo / "ias.py") not in exec_start:
        return None
    return absolute(data_dir)


def locate(config: Config, path: str | None, environ: Mapping[str, str] = os.environ,
           unit_path: Path | None = None) -> Config:
    """`config`, or, when its data directory is the default and this checkout is installed as a service (the unit
    at `unit_path`, by default UNIT_PATH), the config loaded again with the service's data directory."""
    if environ.get("IAS_DATA_DIR", "").strip() or config.data_dir != absolute(DEFAULT):
        return config
    unit_path = UNIT_PATH if unit_path is None else unit_path
    found = service_data_dir(unit_path, config.repo_root)
    if found is None:
        return config
    log.info("using the service's data directory %s (from %s)", found, unit_path)
    return config_module.load(path, environ={**environ, "IAS_DATA_DIR": str(found)})


def _nearest(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def named(config_path: str | None, environ: Mapping[str, str] = os.environ,
          unit_path: Path | None = None) -> Path | None:
    """The data directory known before the config is read (the env file read with it lives there): IAS_DATA_DIR,
    else, with no ias.toml in play, the installed service's; None: ias.toml or the default decides."""
    given = environ.get("IAS_DATA_DIR", "").strip()
    if given:
        return absolute(given)
    if config_path or environ.get("IAS_CONFIG", "").strip() or Path("ias.toml").exists():
        return None
    return service_data_dir(UNIT_PATH if unit_path is None else unit_path)


def before_config(config_path: str | None) -> None:
    """`check` the data directory `named` before the config is read, when it exists: its env file is read with the
    config (a missing one is checked after, with the directory the config settles on)."""
    directory = named(config_path)
    if directory is not None and directory.exists():
        check(directory)


def act_as_owner(directory: Path | None, *, euid: int | None = None,
                 become: Callable[[pwd.struct_passwd, Path], None] | None = None) -> None:
    """As root on an existing data directory another user owns (the service's): `become` that user (by default:
    exec this command again as the owner) before anything there is read: its env file is refused to others."""
    euid = os.geteuid() if euid is None else euid
    if directory is None or euid != 0 or not directory.is_dir():
        return
    owner = directory.stat().st_uid
    if owner == 0:
        return
    try:
        entry = pwd.getpwuid(owner)
    except KeyError:
        raise ConfigError(f"the data directory {directory} belongs to uid {owner}, which has no user name: "
                          "chown it to the service's user") from None
    (become or become_owner)(entry, directory)


def check(directory: Path, *, euid: int | None = None,
          become: Callable[[pwd.struct_passwd, Path], None] | None = None) -> None:
    """Make sure this process may use the data directory: ConfigError (one line) when not; as root on a directory
    another user owns, `act_as_owner`. Called before the config is read (for the directory `named`, whose env file
    it reads) and after (for the one it settled on)."""
    euid = os.geteuid() if euid is None else euid
    me = _name(euid)
    if not directory.exists():
        base = _nearest(directory)
        if not os.access(base, os.W_OK | os.X_OK):
            raise ConfigError(f"the data directory {directory} does not exist and {me} cannot create it in {base}: "
                              f"create it (sudo install -d -m 700 -o {me} {directory}), or set IAS_DATA_DIR")
        return
    act_as_owner(directory, euid=euid, become=become)
    if euid != 0 and not os.access(directory, os.W_OK | os.X_OK):
        owner_name = _name(directory.stat().st_uid)
        raise ConfigError(f"the data directory {directory} belongs to {owner_name}, not writable by {me}: run the "
                          f"command as {owner_name} (sudo -u {owner_name} …), or set IAS_DATA_DIR")


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def become_owner(entry: pwd.struct_passwd, directory: Path) -> None:
    """Exec this very command again as `entry`'s user (its groups, the same environment and data directory)."""
    import shutil
    from .pgcluster.binaries import unreachable     # here: it imports the cluster's module, few commands need it
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] not in ("", "-c") else None
    setpriv = shutil.which("setpriv")
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    closed = unreachable(Path(sys.executable).parent, entry.pw_uid, groups) or (
        unreachable(script.parent, entry.pw_uid, groups) if script else None)
    if setpriv is None or script is None or closed is not None:
        why = f"{closed} is closed to it" if closed is not None else "setpriv (util-linux) is missing"
        raise ConfigError(f"the data directory {directory} belongs to {entry.pw_name}: run the command as "
                          f"{entry.pw_name} (sudo -u {entry.pw_name} …; running it as that user here failed: {why})")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(setpriv, [setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--",
                        sys.executable, str(script), *sys.argv[1:]],
              {**os.environ, "IAS_DATA_DIR": str(directory), "HOME": entry.pw_dir, "USER": entry.pw_name,
               "LOGNAME": entry.pw_name})

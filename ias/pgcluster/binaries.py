"""Where the PostgreSQL server binaries are: on PATH, the newest /usr/lib/postgresql/*/bin, else the `pgserver`
wheel's (located without importing it); whether the user running them can reach a directory; whether a pid is a
live postgres. Not handled: choosing between major versions beyond "newest"."""
from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import Callable

from ..errors import ClusterError

SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
SYSTEM_BINDIRS = "/usr/lib/postgresql/*/bin"
INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, under "
                f"{SYSTEM_BINDIRS} or in the pgserver wheel: install PostgreSQL (Debian: apt-get install "
                "postgresql), or the wheel (pip install '.[embedded]', or pip install pgserver), "
                "or set IAS_DATABASE_URL to an existing database")


def wheel_bindir() -> Path | None:
    """The `pgserver` wheel's server binaries, located without importing the package (or None)."""
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        return Path(location) / "pginstall" / "bin"
    return None


def _has_server(directory: Path) -> bool:
    # os.path.isfile, not Path.is_file: an unreadable directory (PATH holding /root/bin while
    # running as another user) is "not here", where Path.is_file raises PermissionError.
    return all(os.path.isfile(directory / name) and os.access(directory / name, os.X_OK) for name in SERVER_PROGRAMS)


def system_bindirs(system: str = SYSTEM_BINDIRS) -> list[Path]:
    """The system's PostgreSQL bin directories (`system`: /usr/lib/postgresql/*/bin), the newest version first."""
    return [Path(d) for d in sorted(glob.glob(system), key=_version, reverse=True)]


def _version(directory: str) -> int:
    """/usr/lib/postgresql/15/bin → 15 (so 15 sorts after 9)."""
    name = Path(directory).parent.name
    return int(name) if name.isdigit() else 0


def find_bindir(path: str | None = None, system: str = SYSTEM_BINDIRS,
                wheel: Callable[[], Path | None] = wheel_bindir) -> Path:
    """The directory holding initdb, pg_ctl and postgres: on PATH, else the newest `system` match, else the wheel's."""
    candidates = []
    for entry in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        if entry and os.path.isfile(os.path.join(entry, "pg_ctl")):     # never raises (see _has_server)
            candidates.append((Path(entry) / "pg_ctl").resolve().parent)   # e.g. a /usr/local/bin symlink
    candidates += system_bindirs(system)
    bundled = wheel()
    if bundled is not None:
        candidates.append(bundled)
    for directory in candidates:
        if _has_server(directory):
            return directory
    raise ClusterError(INSTALL_HINT)


def unreachable(directory: Path, uid: int, gids: list[int]) -> Path | None:
    """The first of `directory` and its ancestors that `uid` (in `gids`) may not search, or None."""
    for path in [*reversed(directory.parents), directory]:
        st = path.stat()
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in gids else 0o001
        if not st.st_mode & bit:
            return path
    return None


def alive_postgres(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) postgres process; a stale postmaster.pid names a dead one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    comm, _, rest = stat.partition(" (")[2].rpartition(") ")
    return comm == "postgres" and not rest.startswith(("Z", "X"))

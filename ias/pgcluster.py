"""The embedded PostgreSQL cluster: initdb on first use, a private unix socket, shared by every iAs process.

Used when IAS_DATABASE_URL is unset. The cluster listens on no TCP port; its socket lives in
the data directory itself (mode 0700), so only this OS user (and root) can reach it, which is
why `trust` authentication is acceptable. As root, initdb refuses to run, so the server runs as
the `postgres` OS user.

Sharing: every process that uses the cluster holds a shared flock on `<datadir>.users` for as
long as it does; starting and stopping are serialised by an exclusive flock on `<datadir>.lock`.
A process that is done drops its share and, under the start lock, tries to take the users lock
exclusively: only when that succeeds is nobody else using the server, and it is stopped. A
killed process (kill -9 included) drops its share with its descriptors, so it never keeps the
server up for good — but a server whose last user was killed keeps running until the next user
exits. Not handled: upgrades between PostgreSQL major versions.
"""
from __future__ import annotations

import glob
import importlib.util
import itertools
import logging
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Callable

from .errors import ClusterError
from .limits import CLUSTER_MAX_CONNECTIONS, CLUSTER_RETRY_PAUSE, CLUSTER_STALE_WAIT, CLUSTER_START_TIMEOUT
from .locks import FileLock

log = logging.getLogger(__name__)

PORT = 5432
SOCKET_PATH_MAX = 107          # sun_path limit on Linux, including the socket file name
SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
SYSTEM_BINDIRS = "/usr/lib/postgresql/*/bin"
INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, under "
                f"{SYSTEM_BINDIRS} or in the pgserver wheel: install PostgreSQL (Debian: apt-get install "
                "postgresql), or the wheel (pip install '.[embedded]', or pip install pgserver), "
                "or set IAS_DATABASE_URL to an existing database")

# A small home server: one daemon, a few commands, little data. Each line saves memory or a process.
TUNING = (
    "listen_addresses = ''",                      # unix socket only
    f"max_connections = {CLUSTER_MAX_CONNECTIONS}",
    "shared_buffers = 16MB",
    "wal_buffers = 64kB",                         # these two are touched at start whatever the load
    "max_locks_per_transaction = 32",             # (the lock table is shared: 32 x 50 and more)
    "huge_pages = off",
    "wal_level = minimal",                        # no replication: less WAL, no archiver or senders
    "max_wal_senders = 0",
    "max_replication_slots = 0",
    "max_worker_processes = 0",                   # no background workers at all: no parallel query ...
    "max_parallel_workers = 0",
    "max_parallel_workers_per_gather = 0",
    "max_parallel_maintenance_workers = 0",
    "max_logical_replication_workers = 0",        # ... and no logical replication launcher process
    "autovacuum_max_workers = 1",                 # autovacuum stays on (tables are updated), one worker
    "autovacuum_naptime = 5min",
    "jit = off",
    "log_checkpoints = off",
)


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


def _version(directory: str) -> int:
    name = Path(directory).parent.name
    return int(name) if name.isdigit() else 0


def find_bindir(path: str | None = None, system: str = SYSTEM_BINDIRS,
                wheel: Callable[[], Path | None] = wheel_bindir) -> Path:
    """The directory holding initdb, pg_ctl and postgres: on PATH, else the newest `system` match, else the wheel's."""
    candidates = []
    for entry in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        if entry and os.path.isfile(os.path.join(entry, "pg_ctl")):     # never raises (see _has_server)
            candidates.append((Path(entry) / "pg_ctl").resolve().parent)   # e.g. a /usr/local/bin symlink
    candidates += [Path(d) for d in sorted(glob.glob(system), key=_version, reverse=True)]
    bundled = wheel()
    if bundled is not None:
        candidates.append(bundled)
    for directory in candidates:
        if _has_server(directory):
            return directory
    raise ClusterError(INSTALL_HINT)


class Cluster:
    """One PostgreSQL data directory, shared with every other iAs process that uses it."""

    def __init__(self, datadir: Path, *, fsync: bool = True, bindir: Path | None = None):
        self.datadir = Path(datadir).resolve()
        self.fsync = fsync
        self.bindir = bindir
        self._user: str | None = "postgres" if os.geteuid() == 0 else None
        self._users = FileLock(self.datadir.with_name(self.datadir.name + ".users"))
        self._start_lock = FileLock(self.datadir.with_name(self.datadir.name + ".lock"))

    @property
    def dsn(self) -> str:
        host = str(self.datadir).replace("\\", "\\\\").replace("'", "\\'")     # libpq's quoting rules
        return f"host='{host}' port={PORT} dbname=postgres user=postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        bindir = self.bindir = self.bindir or find_bindir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        try:
            result = subprocess.run([str(bindir / args[0]), *args[1:]], cwd="/", env=env, user=self._user,
                                    capture_output=True, text=True, start_new_session=True,
                                    timeout=CLUSTER_START_TIMEOUT + 30)
        except PermissionError as exc:
            raise ClusterError(self._unreadable(bindir, exc)) from None
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"{args[0]} failed: {exc}") from None
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise ClusterError(f"{args[0]} failed ({self.datadir}): {' / '.join(detail)}")
        return result

    def _unreadable(self, bindir: Path, why: object) -> str:
        return (f"the '{self._user}' OS user cannot run the PostgreSQL binaries in {bindir} ({why}); as root the "
                f"embedded server runs as that user: install PostgreSQL system-wide (apt-get install postgresql), "
                f"or install pgserver where that user can read it (not in a venv under /root)")

    def _check_runnable(self) -> None:
        """As root: fail with a clear line when the `postgres` user cannot run the binaries (a venv under /root)."""
        if self._user:
            result = self._run("postgres", "--version", check=False)
            if result.returncode != 0:
                raise ClusterError(self._unreadable(self.bindir, (result.stderr or result.stdout).strip()))

    def _prepare_dir(self) -> None:
        if len(str(self.datadir)) + len(f"/.s.PGSQL.{PORT}") > SOCKET_PATH_MAX:
            raise ClusterError(f"data directory path too long for a unix socket: {self.datadir} "
                               "(set IAS_DATA_DIR to a shorter path)")
        self.datadir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.datadir, 0o700)
        if self._user:
            uid, gid = self._owner()
            os.chown(self.datadir, uid, gid)
            closed = _unreachable(self.datadir.parent, uid, os.getgrouplist(self._user, gid))
            if closed is not None:
                raise ClusterError(f"the '{self._user}' OS user, which runs the embedded server as root, cannot "
                                   f"reach {self.datadir} ({closed} is closed to it): set IAS_DATA_DIR to a "
                                   "directory it can reach (e.g. /var/lib/ias), or open that directory (chmod o+x)")

    def _owner(self) -> tuple[int, int]:
        try:
            entry = pwd.getpwnam(self._user)
        except KeyError:
            raise ClusterError("running as root needs the 'postgres' OS user for the embedded cluster "
                               "(install the postgresql package, or set IAS_DATABASE_URL)") from None
        return entry.pw_uid, entry.pw_gid

    def initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def _postmaster(self) -> tuple[int, str] | None:
        """The pid and status line from postmaster.pid, or None without (a readable) one."""
        try:
            lines = (self.datadir / "postmaster.pid").read_text(encoding="utf-8", errors="replace").splitlines()
            return int(lines[0]), (lines[7].strip() if len(lines) > 7 else "")
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> bool:
        """Whether a server is up and ready on this data directory (postmaster.pid and the socket; no process
        spawned, so a command that finds the server running starts fast)."""
        found = self._postmaster()
        return (found is not None and found[1] == "ready" and _alive_postgres(found[0])
                and (self.datadir / f".s.PGSQL.{PORT}").exists())

    def start(self) -> str:
        """Use the cluster: create it if needed, start it unless it already runs; return its DSN.

        Idempotent and cheap while this process uses a running server; called again after the
        server died, it starts it again.
        """
        if self._users.held and self.running():
            return self.dsn
        with self._start_lock:
            joined = self._users.acquire(shared=True) if not self._users.held else False
            try:
                self._ensure_running()
            except BaseException:
                if joined:
                    self._users.release()
                raise
        return self.dsn

    def _ensure_running(self) -> None:
        self._prepare_dir()
        if not self.initialised():
            self._check_runnable()
            log.info("creating the embedded PostgreSQL cluster in %s", self.datadir)
            self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--locale=C", "--no-sync")
            with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write("\ninclude_if_exists = 'ias.conf'\n")
        if self.running():
            return
        self._check_runnable()
        self._write_settings()
        stale = self._postmaster() is not None        # a killed server: its backends may still be exiting
        deadline = time.monotonic() + CLUSTER_STALE_WAIT
        for attempt in itertools.count():
            try:
                self._run("pg_ctl", "start", "-D", str(self.datadir), "-w", "-t", str(CLUSTER_START_TIMEOUT),
                          "-l", str(self.datadir / "server.log"))
                break
            except ClusterError:
                if not stale or time.monotonic() > deadline:
                    raise
                if attempt == 0:
                    log.info("embedded PostgreSQL cannot start yet after an unclean stop (old backends still "
                             "exiting); retrying for up to %.0f s", CLUSTER_STALE_WAIT)
                time.sleep(CLUSTER_RETRY_PAUSE)
        log.info("embedded PostgreSQL started in %s", self.datadir)

    def _write_settings(self) -> None:
        socket_dir = str(self.datadir).replace("'", "''")
        settings = [f"unix_socket_directories = '{socket_dir}'", f"port = {PORT}", *TUNING,
                    f"fsync = {'on' if self.fsync else 'off'}"]
        if not self.fsync:
            settings += ["synchronous_commit = off", "full_page_writes = off"]
        conf = self.datadir / "ias.conf"
        conf.write_text("\n".join(settings) + "\n", encoding="utf-8")
        if self._user:
            os.chown(conf, *self._owner())

    def stop(self) -> None:
        """Stop using the cluster; the server is stopped only when no other iAs process uses it."""
        if not self._users.held:
            return
        with self._start_lock:
            self._users.release()
            last = FileLock(self._users.path)
            if not last.acquire(wait=False):
                return                                  # another process still uses the server
            try:
                if self._postmaster() is not None:
                    self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "fast", "-w",
                              "-t", str(CLUSTER_START_TIMEOUT), check=False)
                    log.info("embedded PostgreSQL stopped")
            finally:
                last.release()


def _unreachable(directory: Path, uid: int, gids: list[int]) -> Path | None:
    """The first of `directory` and its ancestors that `uid` (in `gids`) may not search, or None."""
    for path in [*reversed(directory.parents), directory]:
        st = path.stat()
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in gids else 0o001
        if not st.st_mode & bit:
            return path
    return None


def _alive_postgres(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) postgres process; a stale postmaster.pid names a dead one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    comm, _, rest = stat.partition(" (")[2].rpartition(") ")
    return comm == "postgres" and not rest.startswith(("Z", "X"))

"""The embedded PostgreSQL cluster: initdb on first use, a private unix socket, shared by every iAs process.

Used when IAS_DATABASE_URL is unset. The cluster listens on no TCP port; its socket lives in
the data directory itself (mode 0700). Every connection still authenticates with a password
(SCRAM): a generated secret in `<datadir>.password` (mode 0600, the daemon's user, in libpq's
passfile format), which the DSN names as `passfile`, so a process that reaches the socket anyway
(a sandbox, a mount, root's `postgres` user) cannot connect without reading that file. A cluster
that an older iAs created with `trust` gets a password on its next start (single-user mode,
before the server starts). As root, initdb refuses to run, so the server runs as the `postgres`
OS user, with that user's groups; iAs then never writes into the data directory as root (a
link planted there would lead anywhere): its files are written by a child running as `postgres`.

Sharing: every process that uses the cluster holds a shared flock on `<datadir>.users` for as
long as it does; starting and stopping are serialised by an exclusive flock on `<datadir>.lock`.
A process that is done drops its share and, under the start lock, tries to take the users lock
exclusively: only when that succeeds is nobody else using the server, and it is stopped. A
killed process (kill -9 included) drops its share with its descriptors, so it never keeps the
server up for good — but a server whose last user was killed keeps running until the next user
exits. A server that someone else is starting, stopping or restarting (`pg_ctl restart`, a
postmaster.pid naming a live postmaster of this directory) is waited for, never fought: a start
runs `pg_ctl start` only when no server is alive, and after a stop gives a restart a moment to
start the next one first. The server's log (`server.log`, appended to by every start and stop) is
moved to `server.log.1` by the next start once it passes SERVER_LOG_MAX. The WAL kept between checkpoints is bounded (max_wal_size 256MB).
Not handled: upgrades between PostgreSQL major versions; a smart-mode stop by someone else, which
waits for iAs's own connections, is waited for up to CLUSTER_START_TIMEOUT.
"""
from __future__ import annotations

import base64
import glob
import hashlib
import hmac
import importlib.util
import itertools
import logging
import os
import pwd
import secrets
import subprocess
import time
from pathlib import Path
from typing import Callable

from .errors import ClusterError
from .limits import (CLUSTER_HANDOVER, CLUSTER_MAX_CONNECTIONS, CLUSTER_MAX_WAL, CLUSTER_MIN_WAL, CLUSTER_POLL,
                     CLUSTER_RETRY_PAUSE, CLUSTER_STALE_WAIT, CLUSTER_START_TIMEOUT, SERVER_LOG_MAX)
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
    f"max_wal_size = {CLUSTER_MAX_WAL}",          # WAL kept between checkpoints is bounded (default: 1GB)
    f"min_wal_size = {CLUSTER_MIN_WAL}",          # and little of it recycled in advance
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

PASSWORD_BYTES = 32
SCRAM_ITERATIONS = 4096                            # PostgreSQL's own default
# Written over an older cluster's `trust` lines: every connection, socket or TCP, gives the password.
HBA = ("# Written by iAs: every connection authenticates with the password in the data directory's\n"
       "# sibling file <datadir>.password (SCRAM). No replication connections.\n"
       "local all all scram-sha-256\n"
       "host all all 127.0.0.1/32 scram-sha-256\n"
       "host all all ::1/128 scram-sha-256\n")
# Run as the data directory's owner (sh and coreutils, which every user can run, unlike a venv's python
# under /root): stdin into the file "$1", replaced whole (a new file renamed over it) or appended to.
WRITER = ('umask 077 && if [ "$2" = append ]; then exec cat >> "$1"; '
          'else cat > "$1.tmp" && exec mv -fT -- "$1.tmp" "$1"; fi')
_WRITER_ENV = {"PATH": "/usr/bin:/bin"}
# Likewise: the server log "$1" moved to "$2" (the one older log, replaced), as the data directory's owner.
ROTATOR = 'exec mv -fT -- "$1" "$2"'
SERVER_LOG = "server.log"


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 7677), so the password itself never
    reaches the server, its statements or its log."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server = hmac.digest(salted, b"Server Key", "sha256")
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored)}:{_b64(server)}"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _conninfo_value(value: object) -> str:
    """A libpq conninfo value, quoted (libpq's rules: backslash escapes backslash and quote)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


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
    log_max = SERVER_LOG_MAX           # bytes of server.log before a start rotates it

    def __init__(self, datadir: Path, *, fsync: bool = True, bindir: Path | None = None):
        self.datadir = Path(datadir).resolve()
        self.fsync = fsync
        self.bindir = bindir
        self._user: str | None = "postgres" if os.geteuid() == 0 else None
        self.passfile = self._sibling(".password")
        self._users = FileLock(self._sibling(".users"))
        self._start_lock = FileLock(self._sibling(".lock"))

    def _sibling(self, suffix: str) -> Path:
        """A file next to the data directory, in the daemon's own directory (never the server's)."""
        return self.datadir.with_name(self.datadir.name + suffix)

    @property
    def dsn(self) -> str:
        """The connection string: the socket and the password file (libpq reads the password from it)."""
        return (f"host={_conninfo_value(self.datadir)} port={PORT} dbname=postgres user=postgres "
                f"passfile={_conninfo_value(self.passfile)}")

    def _spawn(self, argv: list[str], what: str, *, env: dict[str, str] | None = None,
               **options) -> subprocess.CompletedProcess:
        """Run argv as the cluster's owner (as root: the `postgres` user with its own groups, never root's)."""
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PG")}, "LC_ALL": "C.UTF-8", **(env or {})}
        if self._user:
            uid, gid = self._owner()
            options.update(user=uid, group=gid, extra_groups=os.getgrouplist(self._user, gid))
        try:
            return subprocess.run(argv, cwd="/", env=env, capture_output=True, text=True, start_new_session=True,
                                  timeout=CLUSTER_START_TIMEOUT + 30, **options)
        except PermissionError:
            raise                                       # the caller knows what could not be run
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"{what} failed: {exc}") from None

    def _run(self, *args: str, check: bool = True, **options) -> subprocess.CompletedProcess:
        bindir = self.bindir = self.bindir or find_bindir()
        try:
            result = self._spawn([str(bindir / args[0]), *args[1:]], args[0], **options)
        except PermissionError as exc:
            raise ClusterError(self._unreadable(bindir, exc)) from None
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise ClusterError(f"{args[0]} failed ({self.datadir}): {' / '.join(detail)}")
        return result

    def _write(self, name: str, text: str, *, append: bool = False) -> None:
        """Write a file of the data directory as its owner: as root, a link the `postgres` user planted there
        leads nowhere that user could not write anyway."""
        argv = ["/bin/sh", "-c", WRITER, "sh", str(self.datadir / name), "append" if append else "replace"]
        try:
            result = self._spawn(argv, f"writing {name}", input=text, env=_WRITER_ENV)
        except PermissionError as exc:
            raise ClusterError(f"cannot write {self.datadir / name} as the cluster's owner: {exc}") from None
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise ClusterError(f"cannot write {self.datadir / name} as the cluster's owner: {detail}")

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
            closed = unreachable(self.datadir.parent, uid, os.getgrouplist(self._user, gid))
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
            # The server's own directory: no link followed, and a planted FIFO cannot block us.
            fd = os.open(self.datadir / "postmaster.pid", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with open(fd, encoding="utf-8", errors="replace") as pidfile:
                lines = pidfile.read(4096).splitlines()
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
            password = secrets.token_hex(PASSWORD_BYTES)
            self._initdb(password)
            self._write("postgresql.conf", "\ninclude_if_exists = 'ias.conf'\n", append=True)
            self._save_password(password)
        if self._await_other():
            return                                      # a server without a password yet gets one when it restarts
        self._check_runnable()
        self._write_settings()
        self._rotate_log()
        stale = self._postmaster() is not None        # a killed server: its backends may still be exiting
        deadline = time.monotonic() + CLUSTER_STALE_WAIT
        for attempt in itertools.count():
            if self._await_other():
                return                                  # someone else's start (a `pg_ctl restart`) made it ready
            try:
                if not self.passfile.exists():
                    self._set_password()
                self._run("pg_ctl", "start", "-D", str(self.datadir), "-w", "-t", str(CLUSTER_START_TIMEOUT),
                          "-l", str(self.datadir / SERVER_LOG))
                break
            except ClusterError:
                # Lost a race with another start (a postmaster.pid appeared meanwhile): wait for that server.
                # A stale server's backends: retry for a while. Anything else is this start's own failure.
                if not (stale or self._postmaster() is not None) or time.monotonic() > deadline + (
                        CLUSTER_START_TIMEOUT if self._backends_left() else 0):
                    raise
                if attempt == 0:
                    log.info("embedded PostgreSQL cannot start yet (another start, or old backends of an unclean "
                             "stop still exiting); retrying for up to %.0f s", CLUSTER_STALE_WAIT)
                time.sleep(CLUSTER_RETRY_PAUSE)
        log.info("embedded PostgreSQL started in %s", self.datadir)

    def _await_other(self) -> bool:
        """Never fight a server that someone else is starting, stopping or restarting (`pg_ctl restart`, another
        iAs process): while postmaster.pid names a live postmaster of this data directory, wait, and after it
        exits give a restart CLUSTER_HANDOVER s to start the next one. True once a server is ready; False when
        there is none to wait for (then it is this process's to start), or after CLUSTER_START_TIMEOUT."""
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT
        other = gone_at = None                          # the live postmaster waited for; when it went away
        while not self.running():
            now = time.monotonic()
            found = self._postmaster()
            if found is not None and self._postmaster_alive(found[0]):
                if other is None:
                    log.info("embedded PostgreSQL in %s is %s (pid %d, not started by this process): waiting for "
                             "it", self.datadir, found[1] or "starting", found[0])
                other, gone_at = found[0], None
            elif other is None:
                return False
            elif gone_at is None:
                gone_at = now
            elif now - gone_at > CLUSTER_HANDOVER:
                return False                            # it was stopped, not restarted
            if now > deadline:
                return False
            time.sleep(CLUSTER_POLL)
        if other is not None:
            log.info("embedded PostgreSQL in %s is ready again", self.datadir)
        return True

    def _postmaster_alive(self, pid: int) -> bool:
        """Whether `pid` is a live postmaster of this data directory (a postgres process whose working directory
        it is, where that can be read: a stale pid reused by another postgres is not waited for)."""
        if not _alive_postgres(pid):
            return False
        try:
            return os.readlink(f"/proc/{pid}/cwd") == str(self.datadir)
        except OSError:
            return True                                 # not ours to look into: a live postgres is enough

    def _backends_left(self) -> bool:
        """Whether postgres processes of this data directory still run (a killed server's backends finish their
        statement before they notice: a long one keeps the shared memory, and so a new start, waiting)."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _alive_postgres(int(entry.name)):
                try:
                    if os.readlink(entry / "cwd") == str(self.datadir):
                        return True
                except OSError:
                    continue
        return False

    def _initdb(self, password: str) -> None:
        """initdb with password authentication; the verifier reaches it through a memfd, which the `postgres`
        user can open where it could not open a root-owned pipe or file."""
        pwfile = os.memfd_create("ias-pwfile")
        try:
            os.write(pwfile, f"{scram_verifier(password)}\n".encode())
            self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=scram-sha-256",
                      f"--pwfile=/proc/self/fd/{pwfile}", "--encoding=UTF8", "--locale=C", "--no-sync",
                      pass_fds=(pwfile,))
        finally:
            os.close(pwfile)

    def _set_password(self) -> None:
        """A stopped cluster without a password file (made with `trust` by an older iAs, or the file lost): a new
        password, set in single-user mode (no connection needed), then pg_hba.conf closed to all without it."""
        password = secrets.token_hex(PASSWORD_BYTES)
        result = self._run("postgres", "--single", "-D", str(self.datadir), "postgres",
                           input=f"ALTER ROLE postgres PASSWORD '{scram_verifier(password)}';\n")
        errors = [line for line in result.stderr.splitlines() if "ERROR:" in line]    # its exit status is 0
        if errors:
            raise ClusterError(f"setting the embedded cluster's password failed ({self.datadir}): "
                               f"{errors[0].partition('ERROR:')[2].strip()}")
        self._write("pg_hba.conf", HBA)
        self._save_password(password)
        log.info("embedded PostgreSQL in %s: a new password set up (the cluster had no password file)", self.datadir)

    def _save_password(self, password: str) -> None:
        """The password in libpq's passfile format, mode 0600, written whole or not at all."""
        partial = self._sibling(".password.tmp")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "w", encoding="ascii") as out:
            out.write(f"*:*:*:postgres:{password}\n")
            out.flush()
            os.fsync(fd)
        os.replace(partial, self.passfile)

    def _write_settings(self) -> None:
        socket_dir = str(self.datadir).replace("'", "''")
        settings = [f"unix_socket_directories = '{socket_dir}'", f"port = {PORT}", *TUNING,
                    f"fsync = {'on' if self.fsync else 'off'}"]
        if not self.fsync:
            settings += ["synchronous_commit = off", "full_page_writes = off"]
        self._write("ias.conf", "\n".join(settings) + "\n")

    def _rotate_log(self) -> None:
        """Before a start (every command run while the daemon is down starts the server, and pg_ctl appends its
        log): a server.log over `log_max` bytes becomes server.log.1, replacing the older one, so the log
        takes at most about twice the limit (a server running for months appends only its warnings)."""
        log_file = self.datadir / SERVER_LOG
        try:
            if os.lstat(log_file).st_size <= self.log_max:
                return
        except OSError:
            return                                      # no log yet
        argv = ["/bin/sh", "-c", ROTATOR, "sh", str(log_file), str(log_file) + ".1"]
        result = self._spawn(argv, "rotating server.log", env=_WRITER_ENV)
        if result.returncode != 0:                      # the server starts anyway: an old log is no reason to stop
            log.warning("cannot rotate %s: %s", log_file, (result.stderr.strip().splitlines() or ["no output"])[-1])

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


def unreachable(directory: Path, uid: int, gids: list[int]) -> Path | None:
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

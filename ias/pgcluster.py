"""The embedded PostgreSQL cluster: initdb on first use, started on a private unix socket, stopped on exit.

Used when IAS_DATABASE_URL is unset. The cluster listens on no TCP port; its socket lives in
the data directory itself (mode 0700), so only this OS user (and root) can reach it, which is
why `trust` authentication is acceptable. As root, initdb refuses to run, so the server runs as
the `postgres` OS user. Not handled: upgrades between PostgreSQL major versions.
"""
from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from .errors import ClusterError

log = logging.getLogger(__name__)

PORT = 5432
SOCKET_PATH_MAX = 107          # sun_path limit on Linux, including the socket file name
START_TIMEOUT = 60             # seconds pg_ctl waits for the server
INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install PostgreSQL "
                "(Debian: apt-get install postgresql) or set IAS_DATABASE_URL to an existing database")


def find_bindir() -> Path:
    """The directory holding initdb and pg_ctl: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0)
    for directory in reversed(candidates):
        if (Path(directory) / "pg_ctl").exists() and (Path(directory) / "initdb").exists():
            return Path(directory)
    raise ClusterError(INSTALL_HINT)


class Cluster:
    """One PostgreSQL data directory that this process may create, start and stop."""

    def __init__(self, datadir: Path, *, fsync: bool = True, bindir: Path | None = None):
        self.datadir = Path(datadir).resolve()
        self.fsync = fsync
        self.bindir = bindir
        self.started = False          # True when this process started the server (and so stops it)
        self._user: str | None = "postgres" if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"host={self.datadir} port={PORT} dbname=postgres user=postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        bindir = self.bindir or find_bindir()
        self.bindir = bindir
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        try:
            result = subprocess.run([str(bindir / args[0]), *args[1:]], cwd="/", env=env, user=self._user,
                                    capture_output=True, text=True, start_new_session=True,
                                    timeout=START_TIMEOUT + 30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"{args[0]} failed: {exc}") from None
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise ClusterError(f"{args[0]} failed ({self.datadir}): {' / '.join(detail)}")
        return result

    def _prepare_dir(self) -> None:
        if len(str(self.datadir)) + len(f"/.s.PGSQL.{PORT}") > SOCKET_PATH_MAX:
            raise ClusterError(f"data directory path too long for a unix socket: {self.datadir} "
                               "(set IAS_DATA_DIR to a shorter path)")
        self.datadir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.datadir, 0o700)
        if self._user:
            try:
                entry = pwd.getpwnam(self._user)
            except KeyError:
                raise ClusterError("running as root needs the 'postgres' OS user for the embedded cluster "
                                   "(install the postgresql package, or set IAS_DATABASE_URL)") from None
            os.chown(self.datadir, entry.pw_uid, entry.pw_gid)

    def initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def running(self) -> bool:
        return self.initialised() and self._run("pg_ctl", "status", "-D", str(self.datadir), check=False).returncode == 0

    def start(self) -> str:
        """Create the cluster if needed and start it unless it already runs; return its DSN."""
        self._prepare_dir()
        if not self.initialised():
            log.info("creating the embedded PostgreSQL cluster in %s", self.datadir)
            self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--locale=C", "--no-sync")
            with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write("\ninclude_if_exists = 'ias.conf'\n")
        if self.running():
            return self.dsn
        socket_dir = str(self.datadir).replace("'", "''")
        settings = [f"unix_socket_directories = '{socket_dir}'", "listen_addresses = ''",
                    f"port = {PORT}", f"fsync = {'on' if self.fsync else 'off'}"]
        if not self.fsync:
            settings += ["synchronous_commit = off", "full_page_writes = off"]
        conf = self.datadir / "ias.conf"
        conf.write_text("\n".join(settings) + "\n", encoding="utf-8")
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(conf, entry.pw_uid, entry.pw_gid)
        self._run("pg_ctl", "start", "-D", str(self.datadir), "-w", "-t", str(START_TIMEOUT),
                  "-l", str(self.datadir / "server.log"))
        self.started = True
        log.info("embedded PostgreSQL started in %s", self.datadir)
        return self.dsn

    def stop(self) -> None:
        """Stop the server if this process started it."""
        if self.started:
            self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "fast", "-w", check=False)
            self.started = False
            log.info("embedded PostgreSQL stopped")

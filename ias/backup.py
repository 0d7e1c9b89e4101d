"""`ias backup [FILE]` and `ias restore FILE`: the database in pg_dump's custom format, and back.

This module is the one that runs pg_dump and pg_restore: the client programs beside the embedded
cluster's server (`pgcluster.find_bindir`), or, with IAS_DATABASE_URL, the system's. A dump is one
snapshot (pg_dump's own transaction), so a backup is consistent while the daemon runs and writes:
it joins the shared embedded cluster as any command does (SPEC §4). The file is written 0600 (it
holds the conversation history and the WeChat login) under a temporary name, then renamed.

A backup holds the database only, not the secret key (approval codes, the audit chain's key) nor
the chain head file: the key is kept apart, since a backup and its key together let anyone forge the
audit log. `restore` loads a backup into an empty database only; the schema is then brought up to
date as at any start, and the restored audit log is verified with the data directory's key: intact,
its newest row becomes the chain head kept outside the database (`audit.anchor`); written under
another key, it cannot be verified and nothing is anchored (the owner is told what to do).

Not handled: restoring over a database that holds anything (refused, one line); a dump made by a
newer PostgreSQL than the pg_restore at hand; backups on a schedule (cron `ias backup` does that).
"""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from .app import open_store
from .audit import anchor
from .clock import SYSTEM
from .config import Config, absolute
from .errors import IasError
from .limits import BACKUP_TIMEOUT, RESTORE_PROBLEMS_SHOWN
from .pgcluster import embedded
from .pgcluster.binaries import SYSTEM_BINDIRS, find_bindir, system_bindirs
from .store import objects, without_password

MAGIC = b"PGDMP"                        # the first bytes of every custom-format dump


class BackupError(IasError):
    """A backup or a restore that could not be made (one line naming why)."""


def client(config: Config, name: str) -> Path:
    """The program `name` (pg_dump, pg_restore): beside the embedded cluster's server, or for IAS_DATABASE_URL
    the system's (PATH, else the newest under /usr/lib/postgresql)."""
    if not config.database_url:
        program = find_bindir() / name
        if not os.access(program, os.X_OK):
            raise BackupError(f"{program} is missing beside the PostgreSQL server binaries: install the PostgreSQL "
                              "client programs of the same version")
        return program
    found = shutil.which(name)
    if found:
        return Path(found)
    for directory in system_bindirs():
        if os.access(directory / name, os.X_OK):
            return directory / name
    raise BackupError(f"{name} not found on PATH or under {SYSTEM_BINDIRS}: install the PostgreSQL client "
                      "(Debian: apt-get install postgresql-client) of the server's version or newer")


def default_file(now: datetime, directory: Path) -> Path:
    """`ias-backup-YYYYmmdd-HHMMSS.dump` in `directory` (the time in the owner's zone)."""
    return directory / f"ias-backup-{now:%Y%m%d-%H%M%S}.dump"


def _client(program: Path, args: list[str], dsn: str, what: str) -> None:
    """Run a PostgreSQL client program on `dsn` (its password in the environment, not on the command line);
    BackupError with its last lines when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    dsn, password = without_password(dsn)
    if password is not None:
        env["PGPASSWORD"] = password
    try:
        result = subprocess.run([str(program), *args, f"--dbname={dsn}"], env=env, cwd="/", capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, umask=0o077, timeout=BACKUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise BackupError(f"{what}: {program.name} did not finish within {BACKUP_TIMEOUT} s") from None
    except OSError as exc:
        raise BackupError(f"{what}: cannot run {program}: {exc.strerror}") from None
    if result.returncode != 0:
        detail = " / ".join(result.stderr.strip().splitlines()[-3:]) or f"exit status {result.returncode}"
        raise BackupError(f"{what} failed: {detail}")


async def cmd_backup(config: Config, file: str | None, now: datetime | None = None) -> int:
    target = absolute(file) if file else default_file(now or SYSTEM.now(), Path.cwd())
    if target.exists():
        raise BackupError(f"{target} exists: name another file")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory")
    if not os.access(target.parent, os.W_OK | os.X_OK):        # e.g. run as the service's user in its checkout
        raise BackupError(f"cannot write in {target.parent} as {getpass.getuser()}: name a file where it can, e.g. "
                          f"{default_file(now or SYSTEM.now(), config.data_dir)}")
    cluster = embedded(config)
    if cluster is not None and not cluster.initialised():
        raise BackupError(f"no database in {config.data_dir} (IAS_DATA_DIR): nothing to back up")
    pg_dump = client(config, "pg_dump")
    partial = target.with_name(f".{target.name}.partial")
    try:
        dsn = config.database_url or cluster.start()
        _client(pg_dump, ["--format=custom", "--no-owner", "--no-privileges", f"--file={partial}"], dsn,
                "backup")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
        if cluster is not None:
            cluster.stop()
    print(f"backup written to {target} ({target.stat().st_size} bytes)")
    print(f"it holds the database, not the secret key {config.key_file}: keep a copy of that key apart, "
          "never beside the backup (restored with it, the audit log can be verified)")
    return 0


async def cmd_restore(config: Config, file: str) -> int:
    source = absolute(file)
    try:
        with open(source, "rb") as dump:
            if dump.read(len(MAGIC)) != MAGIC:
                raise BackupError(f"{source} is not an `ias backup` file (pg_dump's custom format)")
    except OSError as exc:
        raise BackupError(f"cannot read {source}: {exc.strerror}") from None
    had_key = config.key_file.exists()
    cluster = embedded(config)
    pg_restore = client(config, "pg_restore")
    try:
        dsn = config.database_url or cluster.start()
        if await objects(dsn):
            where = "the database at IAS_DATABASE_URL" if config.database_url else f"the database in {config.data_dir}"
            raise BackupError(f"{where} is not empty: restore only into an empty one (a new IAS_DATA_DIR, or a new "
                              "database), with iAs stopped")
        _client(pg_restore, ["--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
                         str(source)], dsn, "restore")
        async with open_store(config, cluster) as store:      # migrations bring an older backup up to date
            verdict = await anchor(store)
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"restored {source} into {'IAS_DATABASE_URL' if config.database_url else config.data_dir}")
    if verdict.intact:
        print(f"{verdict.summary()}; verified with the key {config.key_file}, chain head kept in {config.audit_head}")
        return 0
    for line in verdict.problems[:RESTORE_PROBLEMS_SHOWN]:
        print(line, file=sys.stderr)
    why = ("there was no secret key, so a new one was made" if not had_key
           else "it was written under another secret key, or changed")
    empty = "an empty database" if config.database_url else f"an empty database (stop iAs, remove {config.cluster_dir})"
    print(f"audit log: cannot be verified with {config.key_file} ({why}): to verify it, put the backed-up "
          f"installation's secret.key at {config.key_file} and restore again into {empty}; the restored data is "
          "in place, and rows written from now on are chained under the present key", file=sys.stderr)
    return 1

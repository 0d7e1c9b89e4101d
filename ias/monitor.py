"""The database monitor: notices a lost database, reconnects, and gives up loudly after a limit.

Nothing polls: whoever meets a StoreError calls `suspect()` — the scheduler's LISTEN
connection sees EOF the moment the server goes away, a turn meets it on its next statement.
The monitor then checks with a fresh connection; if that fails too, the database is
*unavailable*: it tries a connection at least every DB_RETRY_MAX seconds (a restarted server is
used again within that), and, when the database is iAs's own, starts the embedded server with an
exponential backoff of its own (`Cluster.start()` is idempotent, and waits for a server that
someone else is starting or restarting rather than fighting it). Reachable
again: `available` is set and waiters resume. Still unreachable after DB_LOST_LIMIT seconds:
one log line and `on_gone`, which makes the daemon exit non-zero so that systemd's
Restart=on-failure acts — never a daemon that only apologises.

Not handled: a statement that fails for other reasons (a constraint, a bug) also triggers a
check, which then simply finds the database reachable.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

from .errors import IasError, StoreError
from .limits import DISK_CHECK_INTERVAL, DISK_LOW_SHARE, DB_LOST_LIMIT, DB_RESTART_MAX, DB_RETRY_FIRST, DB_RETRY_MAX
from .store import Store

log = logging.getLogger(__name__)

T = TypeVar("T")


class DatabaseMonitor:
    """Whether the database is reachable now, and the reconnect loop when it is not."""

    def __init__(self, store: Store, on_gone: Callable[[str], None], *, restart: Callable[[], object] | None = None,
                 limit: float = DB_LOST_LIMIT, first_delay: float = DB_RETRY_FIRST, max_delay: float = DB_RETRY_MAX,
                 restart_delay: float = DB_RESTART_MAX, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.on_gone = on_gone
        self.restart = restart          # blocking (runs pg_ctl): called in a thread
        self.limit = limit
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.restart_delay = restart_delay
        self.clock = clock
        self._suspect = asyncio.Event()
        self._available = asyncio.Event()
        self._available.set()
        self._checked = asyncio.Event()      # set after each check (or outage) is over
        self._outages = 0

    @property
    def available(self) -> bool:
        return self._available.is_set()

    async def back(self) -> None:
        """Until the database is available (at once when it is)."""
        await self._available.wait()

    def suspect(self) -> None:
        """A statement failed with a StoreError: check the database soon (returns at once)."""
        self._suspect.set()

    async def settle(self, since: int | None = None) -> bool:
        """Suspect the database and wait for the verdict; True when it was lost (and is back now). `since`:
        the outage count taken when the failed statement began (one that began before an outage and
        failed after it ended is still the outage's)."""
        before = self._outages if since is None else since
        self._checked.clear()
        self.suspect()
        await self._checked.wait()
        await self._available.wait()
        return self._outages != before

    async def through(self, step: Callable[[], Awaitable[T]],
                      waiting: Callable[[StoreError], Awaitable[object]] | None = None) -> T:
        """`step()`, done again after each outage of the database it meets (`waiting` told of each first); a
        StoreError that was no outage (the database is fine: an error of another kind) propagates."""
        while True:
            before = self._outages
            try:
                return await step()
            except StoreError as exc:
                if waiting is not None:
                    await waiting(exc)
                if not await self.settle(before):
                    raise

    async def run(self) -> None:
        """Forever: wait for a suspicion, check it, and reconnect when the database is really gone."""
        while True:
            await self._suspect.wait()
            self._suspect.clear()
            try:
                await self.store.reconnect()
                self._checked.set()
                continue                        # the database is fine: the failure was something else
            except StoreError as exc:
                reason = exc
            self._outages += 1
            self._available.clear()
            log.error("database lost (%s); reconnecting%s", reason,
                      " and restarting the embedded PostgreSQL" if self.restart else "")
            lost_at = self.clock()
            reason = await self._reconnect(lost_at)
            if reason is not None:
                log.critical("database unreachable for %.0fs (%s); exiting so that the service manager "
                             "restarts iAs", self.clock() - lost_at, reason)
                self.on_gone(f"database unreachable: {reason}")
                return
            log.warning("database reachable again after %.1fs", self.clock() - lost_at)
            self._suspect.clear()
            self._available.set()
            self._checked.set()

    async def _reconnect(self, lost_at: float) -> Exception | None:
        """Retry until connected (None) or past the limit (the last error): connection attempts at most
        `max_delay` apart (a server back up is used within that), restarts of the embedded server with a
        backoff of their own up to `restart_delay` (a server that cannot start is not hammered)."""
        delay = restart_delay = self.first_delay
        restart_at = lost_at
        while True:
            if self.restart is not None and self.clock() >= restart_at:
                try:
                    await asyncio.to_thread(self.restart)     # waits for a server someone else is (re)starting
                except IasError as exc:
                    log.debug("restarting the embedded PostgreSQL failed: %s", exc)
                restart_at = self.clock() + restart_delay
                restart_delay = min(restart_delay * 2, self.restart_delay)
            try:
                await self.store.reconnect()
                return None
            except StoreError as exc:
                last = exc
            left = self.limit - (self.clock() - lost_at)
            if left <= 0:
                return last
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, self.max_delay)


# -- free space under the data directory (SPEC §15 "Disk") --

LOW_DISK = "磁盘空间不足：数据目录所在分区仅剩 {share}（可用 {free}，共 {total}；{path}）。空间用尽时数据库会停止，请尽快清理。"


def disk_space(path: Path, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> tuple[float, int, int]:
    """(free share, free bytes, total bytes) of the file system holding `path` (or its nearest existing
    parent), as an unprivileged user sees it (f_bavail: root's reserve does not count)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = statvfs(str(path))
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return (free / total if total else 1.0), free, total


def low_disk(path: Path, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> str | None:
    """The owner's warning when less than DISK_LOW_SHARE of the space under `path` is free, else None."""
    share, free, total = disk_space(path, statvfs)
    if share >= DISK_LOW_SHARE:
        return None
    return LOW_DISK.format(share=f"{share:.1%}", free=_size(free), total=_size(total), path=Path(path).resolve())


def _size(count: int) -> str:
    for unit, scale in (("GB", 2 ** 30), ("MB", 2 ** 20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 2 ** 10:.0f} KB"


class DiskWatch:
    """The daemon's periodic look at free space under the data directory: the owner is told once when it
    falls below DISK_LOW_SHARE (again only after it has recovered and fallen again). A warning that cannot
    be queued (the database is down: a full disk stops it) is tried again at the next check."""

    def __init__(self, path: Path, tell: Callable[[str], Awaitable[object]], *,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs, interval: float = DISK_CHECK_INTERVAL):
        self.path = path
        self.tell = tell
        self.statvfs = statvfs
        self.interval = interval
        self.told = False

    async def check(self) -> None:
        try:
            warning = low_disk(self.path, self.statvfs)
        except OSError as exc:
            log.warning("cannot check the free space under %s: %s", self.path, exc)
            return
        if warning is None:
            self.told = False
            return
        if self.told:
            return
        log.warning("low disk space under %s: %s", self.path, warning)
        try:
            await self.tell(warning)
        except StoreError as exc:
            log.warning("the low disk warning is not queued yet (%s); trying again at the next check", exc)
            return
        self.told = True

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval)

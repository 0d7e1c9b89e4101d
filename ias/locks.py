"""Advisory file locks (`flock`) in the data directory: the daemon's single-instance lock and the
embedded cluster's users and start/stop locks.

A flock belongs to an open file description, so the kernel drops it when the holder exits,
however it dies (kill -9 included), and it does not depend on any database connection. The
descriptors are close-on-exec, so PostgreSQL and skills never inherit (and never keep) a lock.
Not handled: network file systems, where flock may not be shared between machines.

Also here: `UserLocks`, the in-process per-user turn locks (asyncio), which forget a user as
soon as nobody holds or waits for their lock, so the table never grows with users seen once.
"""
from __future__ import annotations

import asyncio
import fcntl
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from .errors import IasError


class FileLock:
    """One lock file; at most one lock (shared or exclusive) held through it at a time."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, shared: bool = False, wait: bool = True) -> bool:
        """Take the lock (blocking unless `wait` is False); False when it is taken elsewhere."""
        if self._fd is not None:
            raise RuntimeError(f"lock already held: {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:        # e.g. created by root, used by the service user
            raise IasError(f"cannot open the lock file {self.path}: {exc.strerror}") from None
        operation = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock by closing its descriptor (re-locking needs a fresh one: flock is per description)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class UserLocks:
    """One asyncio lock per user, taken in turn; an entry lives only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}     # user -> (lock, holders and waiters)

    def __len__(self) -> int:
        """How many users hold or wait for their lock."""
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        """Hold `user_id`'s lock, after whoever holds or waits for it already."""
        lock, users = self._locks.get(user_id, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[user_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[user_id]
            if users == 1:
                del self._locks[user_id]
            else:
                self._locks[user_id] = (lock, users - 1)

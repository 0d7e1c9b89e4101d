"""Advisory file locks (`flock`) in the data directory: the daemon's single-instance lock and the
embedded cluster's users and start/stop locks.

A flock belongs to an open file description, so the kernel drops it when the holder exits,
however it dies (kill -9 included), and it does not depend on any database connection. The
descriptors are close-on-exec, so PostgreSQL and skills never inherit (and never keep) a lock.
Not handled: network file systems, where flock may not be shared between machines.

Also here: `UserLocks`, the in-process per-user FIFO locks (asyncio) of the router and the
approvals. A place in a user's line is taken synchronously (`place()`), so the order of the
calls is the order of the holders, whatever each awaits before it gets round to waiting; a user
is forgotten as soon as nobody holds or waits, so the table never grows with users seen once.
"""
from __future__ import annotations

import asyncio
import fcntl
import os
from collections import deque
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
    """One FIFO line per user: places are taken in call order and held one at a time; a user's line
    lives only while someone holds or waits in it."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[Place]] = {}

    def __len__(self) -> int:
        """How many users hold or wait for their lock."""
        return len(self._lines)

    def place(self, user_id: str) -> "Place":
        """Take a place in `user_id`'s line now, without waiting (so the order is the order of the calls);
        `async with` it to wait for it to come up. Must be entered or released, or the line stops."""
        line = self._lines.setdefault(user_id, deque())
        place = Place(self, user_id, asyncio.get_running_loop().create_future())
        line.append(place)
        if len(line) == 1:
            place._ready.set_result(None)
        return place

    @asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        """Hold `user_id`'s lock, after whoever holds or waits for it already."""
        async with self.place(user_id):
            yield

    def _leave(self, place: "Place") -> None:
        line = self._lines[place.user_id]
        first = line[0] is place
        line.remove(place)
        if not line:
            del self._lines[place.user_id]
        elif first and not line[0]._ready.done():
            line[0]._ready.set_result(None)


class Place:
    """One place in a user's line: `async with` waits until it is first and leaves on exit; `release()`
    leaves earlier (idempotent), e.g. when whoever took it will never enter it."""

    __slots__ = ("_locks", "user_id", "_ready", "_left")

    def __init__(self, locks: UserLocks, user_id: str, ready: asyncio.Future):
        self._locks, self.user_id, self._ready, self._left = locks, user_id, ready, False

    async def __aenter__(self) -> "Place":
        try:
            await self._ready
        except BaseException:           # cancelled while waiting: the place goes to the next in line
            self.release()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Leave the line (handing it to the next place if this one was first)."""
        if not self._left:
            self._left = True
            self._locks._leave(self)

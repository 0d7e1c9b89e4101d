"""The daemon's supervisor: every background task runs under it, and one that dies stops the daemon.

Like `asyncio.TaskGroup`, a task that raises takes the whole daemon down — loudly: its
traceback is logged and the daemon exits non-zero, so the service manager restarts it (a
daemon whose scheduler silently died would look alive and do nothing). Unlike TaskGroup, the
daemon decides the order in which things stop on SIGTERM (skills first, then the calls'
records, then the turns), so tasks are cancelled by `cancel()`, not on the first failure.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

log = logging.getLogger(__name__)


class Supervisor:
    """Spawns named tasks; the first crash (or `fail()`) sets `failed`."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()
        self.reason: str | None = None
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        """Run `coro` as a supervised task."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def fail(self, reason: str) -> None:
        """Stop the daemon with a non-zero exit (the caller has logged why)."""
        if self.reason is None:
            self.reason = reason
        self.failed.set()

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("task %s crashed; stopping iAs", task.get_name(), exc_info=exc)
            self.fail(f"task {task.get_name()} crashed: {exc!r}")

    async def cancel(self, timeout: float) -> None:
        """Cancel every task still running and wait up to `timeout` s for them to end."""
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

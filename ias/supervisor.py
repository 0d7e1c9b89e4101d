"""The supervisor: the one owner of every background task, in named groups, stopped in a chosen order.

After aio-libs/aiojobs: `spawn(coro, name, group=…)` starts a tracked task, `shield(coro, name)`
runs one that a cancelled caller does not interrupt (the end of a skill call, a sent part's mark)
and that `close` waits for, and a group may bound how many of its holders run at once (`Scope.slot`:
the turns). Each module is given the supervisor (or one of its groups, a `Scope`) when it is built,
so "what is running" is a question to a group (`Scope.active`), never a set of tasks kept by hand.

Like `asyncio.TaskGroup`, a task that raises is never silent (STYLE 14): its traceback is logged
at CRITICAL and `failed` is set, which the daemon waits on to exit non-zero, so the service
manager restarts it (a daemon whose scheduler silently died would look alive and do nothing). A
one-off command's supervisor does the same; the command then decides its own exit status. A
shielded task's exception goes to its caller while the caller waits; once the caller is gone it
counts as a crash. Unlike TaskGroup, nothing is cancelled on the first failure: the daemon decides
the order in which groups stop (`close`).

Not handled: restarting a task that died (the service manager restarts the daemon), limits on how
many tasks a group holds (only `slot` holders are bounded), and tasks started outside the supervisor
for a single await (asyncio.wait over events, gather of helpers) — those end with their caller.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Coroutine, Iterator, Sequence

log = logging.getLogger(__name__)

# The groups the daemon names when it stops (see daemon.py); any other name makes a group of its own.
RECORDS = "records"         # what must be written once started: skill ends, task-run rows, sent parts (waited for)
TURNS = "turns"             # inbound messages being handled; their agent turns take a slot (TURNS_MAX)
TASKS = "tasks"             # scheduled task runs
MCP = "mcp"                 # MCP keepers, readers and relists
CHANNELS = "channels"       # the channels' own loops and deliveries
BACKGROUND = "background"   # the daemon's loops: outbox, monitor, scheduler, watchers


class Scope:
    """One group of the supervisor's tasks. A keeping group's tasks are waited for by `close`, never
    cancelled before the end; `limit` bounds how many `slot` holders run at once (None: unbounded)."""

    def __init__(self, supervisor: Supervisor, name: str, limit: int | None = None, keep: bool = False):
        self.supervisor = supervisor
        self.name = name
        self.limit = limit
        self.keep = keep
        self._pending: set[asyncio.Future] = set()      # its tasks, and the holds of work not started yet
        self._slots = 0                                  # slots held
        self._queue: deque[asyncio.Future] = deque()     # waiting for a slot, first come first served

    @property
    def active(self) -> int:
        """Tasks (and holds) of this group not ended yet."""
        return sum(not future.done() for future in self._pending)

    @property
    def running(self) -> int:
        """Slots held now (at most `limit`)."""
        return self._slots

    @property
    def waiting(self) -> int:
        """Holders waiting for a slot."""
        return sum(not future.done() for future in self._queue)

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        """Run `coro` as a task of this group; a crash of it fails the supervisor."""
        task = self._start(coro, name)
        task.add_done_callback(self.supervisor._report)
        return task

    async def shield(self, coro: Coroutine, name: str, *, grace: float = 0.0):
        """Run `coro` as a task of this group and return its result; a cancelled caller does not cancel it.

        The caller, when cancelled, waits up to `grace` s more for it, then lets the cancellation go
        on; the task goes on under the supervisor (and `close` waits for it in a keeping group)."""
        task = self._start(coro, name)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self.supervisor._report)     # nobody takes its exception now
            if grace > 0 and not task.done():
                await asyncio.wait([task], timeout=grace)
                if not task.done():
                    log.warning("%s still runs %gs after its caller was cancelled; it goes on", name, grace)
            raise

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Work of this group that is no task (yet): `wait` and `close` wait for it as for a task."""
        marker = asyncio.get_running_loop().create_future()
        self._pending.add(marker)
        try:
            yield
        finally:
            marker.set_result(None)
            self._pending.discard(marker)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the group's `limit` places, in the order asked for (the N+1th waits, never dropped)."""
        if self.limit is None:
            yield
            return
        if self._slots < self.limit and not self._queue:
            self._slots += 1
        else:
            turn = asyncio.get_running_loop().create_future()
            self._queue.append(turn)
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():
                    self._free()            # handed a slot just as it was cancelled: pass it on
                elif turn in self._queue:
                    self._queue.remove(turn)
                raise
        try:
            yield
        finally:
            self._free()

    def _free(self) -> None:
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)       # the slot passes straight to the next in line
                return
        self._slots -= 1

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until every task and hold of the group has ended (those started meanwhile too), at most
        `timeout` s; whether all did."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            pending = [future for future in self._pending if not future.done()]
            if not pending:
                return True
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(pending, timeout=left)

    async def cancel(self, timeout: float | None = None) -> None:
        """Cancel the group's tasks and wait up to `timeout` s for them to end."""
        tasks = [task for task in self._pending if isinstance(task, asyncio.Task) and not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def _start(self, coro: Coroutine, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task


class Supervisor:
    """Every background task, in groups; the first crash (or `fail()`) sets `failed` and `reason`.

    `daemon`: a crash is logged as stopping iAs (the daemon waits on `failed`); a one-off command's
    supervisor logs it only, and the command decides."""

    def __init__(self, *, daemon: bool = False) -> None:
        self.daemon = daemon
        self.failed = asyncio.Event()
        self.reason: str | None = None
        self._scopes: dict[str, Scope] = {}
        self.scope(RECORDS, keep=True)

    def scope(self, group: str, *, limit: int | None = None, keep: bool = False) -> Scope:
        """The group named `group`, made on first use with `limit` and `keep`."""
        scope = self._scopes.get(group)
        if scope is None:
            scope = self._scopes[group] = Scope(self, group, limit, keep)
        elif (limit, keep) != (None, False) and (limit, keep) != (scope.limit, scope.keep):
            raise ValueError(f"group {group} exists with limit {scope.limit}, keep {scope.keep}")
        return scope

    def spawn(self, coro: Coroutine, name: str, *, group: str = BACKGROUND) -> asyncio.Task:
        """Run `coro` as a supervised task of `group`."""
        return self.scope(group).spawn(coro, name)

    async def shield(self, coro: Coroutine, name: str, *, grace: float = 0.0):
        """`coro`'s result; it runs to its end in RECORDS even if the caller is cancelled (see Scope.shield)."""
        return await self._scopes[RECORDS].shield(coro, name, grace=grace)

    def fail(self, reason: str) -> None:
        """Stop the daemon with a non-zero exit (the caller has logged why)."""
        if self.reason is None:
            self.reason = reason
        self.failed.set()

    def _report(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("task %s crashed%s", task.get_name(), "; stopping iAs" if self.daemon else "",
                         exc_info=exc)
            self.fail(f"task {task.get_name()} crashed: {exc!r}")

    async def close(self, timeout: float, order: Sequence[str] = ()) -> bool:
        """Stop: the groups in `order` first, one after the other (a keeping group is waited for, any other
        cancelled), then every other group is cancelled, then the keeping groups are waited for again (what
        the cancellations started: a cancelled call records its end) and what is left of them cancelled.
        Each step waits at most `timeout` s; whether every keeping group ended in time."""
        complete = True
        for group in order:
            complete = await self._end(self.scope(group), timeout) and complete
        for scope in list(self._scopes.values()):
            if not scope.keep:
                await scope.cancel(timeout)
        for scope in list(self._scopes.values()):
            if scope.keep:
                complete = await self._end(scope, timeout) and complete
                await scope.cancel(timeout)
        return complete

    @staticmethod
    async def _end(scope: Scope, timeout: float) -> bool:
        if not scope.keep:
            await scope.cancel(timeout)
            return True
        if await scope.wait(timeout):
            return True
        log.error("%d %s task(s) did not end within %.0fs", scope.active, scope.name, timeout)
        return False

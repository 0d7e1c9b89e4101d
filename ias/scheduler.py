"""The scheduler: runs due tasks exactly once per slot, across restarts and competing loops.

The loop sleeps until the earliest `next_run_at` (or until PostgreSQL NOTIFYs a change to the
tasks table), then claims each due slot with one compare-and-set statement. Missed slots after
downtime collapse into one catch-up run: the next slot is computed from *now*, not from the
missed one. A database error in the loop is handed to `on_store_error` (the daemon's database
monitor, which returns once the database is back); any other exception ends `run()` and so,
under the daemon's supervisor, the daemon. Each run is a task of the supervisor's TASKS group
(`stop` cancels them); a cancelled run's row is written in its RECORDS group, which a stop waits
for. Not handled: running one task's slots in parallel is allowed, not prevented.

Clock jumps (a machine without RTC): the loop sleeps at most SCHEDULER_MAX_SLEEP and reads the
wall clock afresh on waking, so after a jump forward due tasks run within that. Each tick
compares how far the wall clock moved with the monotonic clock; when the wall clock went back,
interval tasks move back by as much and so keep their period. Cron and one-shot tasks follow
the wall clock: their slots are wall times, and one that already ran is not run again. An
interval task's next slot lies on the grid through its last slot: the grid of its creation,
unless a jump back moved it (then off the old grid, whose times in the span lived twice
already ran).

Also here: how a due task is named to the owner (`when_text`, and `keeper_ask`, the outbox's
window-keeper request), in Beijing time (clock.TZ).
"""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Awaitable, Callable

from .clock import SYSTEM, TZ
from .cron import parse_schedule
from .errors import StoreError
from .inbox import Inbox
from .limits import CLOCK_JUMP_TOLERANCE, SCHEDULER_MAX_SLEEP, SCHEDULER_RETRY, TASK_REPLY_MAX
from .store import Store, Task
from .supervisor import TASKS, Supervisor

log = logging.getLogger(__name__)

Execute = Callable[[Task, int], Awaitable[str]]     # runs one task (and its run id), returns what was sent to the owner
OnStoreError = Callable[[StoreError], Awaitable[None]]
OFF_GRID = timedelta(milliseconds=1)    # how far a moved interval task keeps clear of the slots that already ran
KEEPER_ASK = "{when} 有{what}「{name}」：回复任意内容，微信才允许我按时发送。"


def when_text(due: datetime, now: datetime) -> str:
    """A due time in Beijing time relative to now: 今天 18:00, 明早 07:00, 明天 15:00, 12月5日 07:00."""
    local, today = due.astimezone(TZ), now.astimezone(TZ).date()
    days = (local.date() - today).days
    if days == 0:
        day = "今天"
    elif days == 1:
        day = "明早" if local.hour < 12 else "明天"
    elif days == 2:
        day = "后天"
    else:
        day = f"{local.month}月{local.day}日"
    return f"{day} {local:%H:%M}"


def keeper_ask(task: Task, now: datetime) -> str:
    """The window keeper's request that the owner write, naming the task due after their window closes."""
    return KEEPER_ASK.format(when=when_text(task.next_run_at, now),
                             what="提醒" if task.kind == "reminder" else "定时任务", name=task.name)


def next_run(task_schedule: str, anchor: datetime, after: datetime) -> datetime | None:
    """The first run of a schedule strictly after `after`; an interval's runs lie on the grid
    through `anchor` (the task's creation, or the slot it ran last)."""
    return parse_schedule(task_schedule, anchor=anchor).next_after(after)


class Scheduler:
    """Claims due slots and runs their tasks through `execute`."""

    def __init__(self, store: Store, execute: Execute, *, now: Callable[[], datetime] = SYSTEM.now,
                 monotonic: Callable[[], float] = SYSTEM.monotonic,
                 max_sleep: float = SCHEDULER_MAX_SLEEP, on_store_error: OnStoreError | None = None,
                 supervisor: Supervisor | None = None):
        self.store = store
        self.execute = execute
        self.now = now
        self.monotonic = monotonic
        self._seen: tuple[datetime, float] | None = None     # (wall, monotonic) at the last tick
        self.max_sleep = max_sleep
        self.on_store_error = on_store_error or retry_later
        self.supervisor = supervisor or Supervisor()     # None: one of its own (tests)
        self.runs = self.supervisor.scope(TASKS)

    async def tick(self) -> list[asyncio.Task]:
        """Claim every slot due now and start its run; returns the started runs."""
        now = self.now()
        await self._follow_clock(now)
        started = []
        for task in await self.store.due_tasks(now):
            slot = task.next_run_at
            try:
                following = next_run(task.schedule, slot, max(now, slot))
            except ValueError as exc:
                log.error("task %d has a bad schedule %r (%s); disabling it", task.id, task.schedule, exc)
                following = None
            run_id = await self.store.claim_slot(task.id, slot, following)
            if run_id is None:
                continue                     # another scheduler took this slot
            log.info("task %d (%s) due at %s: run %d", task.id, task.kind, slot.isoformat(), run_id)
            started.append(self.runs.spawn(self._run(task, run_id), f"task {task.id} run {run_id}"))
        return started

    async def _follow_clock(self, now: datetime) -> None:
        """If the wall clock went back since the last tick, move interval tasks back by as much."""
        monotonic = self.monotonic()
        if self._seen is not None:
            back = (monotonic - self._seen[1]) - (now - self._seen[0]).total_seconds()
            if back > CLOCK_JUMP_TOLERANCE:
                await self._move_intervals(now, timedelta(seconds=back))
        self._seen = (now, monotonic)

    async def _move_intervals(self, now: datetime, back: timedelta) -> None:
        moves = []
        for task in await self.store.tasks(include_disabled=False):
            try:
                schedule = parse_schedule(task.schedule)
                if schedule.kind != "every" or task.next_run_at is None:
                    continue
                to = task.next_run_at - back
                if back % (schedule.next_after(now) - now) == timedelta(0):
                    to += OFF_GRID      # else its slots from `to` on are the times that ran before the jump
            except (ValueError, OverflowError):
                continue                # a bad schedule is disabled when it comes due
            moves.append((task.id, task.next_run_at, to))
        moved = await self.store.move_next_runs(moves) if moves else 0
        log.warning("the wall clock went back %.0fs; %d interval task(s) moved back as much to keep their period",
                    back.total_seconds(), moved)

    async def _run(self, task: Task, run_id: int) -> None:
        try:
            reply = await self.execute(task, run_id)
        except asyncio.CancelledError:
            await self.supervisor.shield(self._finish(run_id, "error", error="cancelled (daemon stopping)"),
                                         f"task run {run_id} end")
            raise
        except Exception as exc:
            log.exception("task %d run %d failed", task.id, run_id)
            await self._finish(run_id, "error", error=str(exc)[:TASK_REPLY_MAX] or type(exc).__name__)
        else:
            await self._finish(run_id, "ok", reply=(reply or "")[:TASK_REPLY_MAX])

    async def _finish(self, run_id: int, status: str, **outcome) -> None:
        try:
            await self.store.finish_run(run_id, status, **outcome)
        except StoreError as exc:       # the run happened; only its row stays 'running'
            log.error("task run %d ended (%s) but could not be recorded: %s", run_id, status, exc)

    async def run(self) -> None:
        """Forever: run what is due, then sleep until the next due time or a change to the tasks."""
        while True:
            try:
                await self.tick()
                due = await self.store.next_due()
                wait = self.max_sleep if due is None else (due - self.now()).total_seconds()
                if wait > 0:
                    await self.store.wait_for_task_change(min(wait, self.max_sleep))
            except StoreError as exc:
                await self.on_store_error(exc)

    async def stop(self) -> None:
        """Cancel runs in flight (their rows end as errors; the slots are not repeated); the daemon's stop
        does this through `Supervisor.close`."""
        await self.runs.cancel()


async def retry_later(exc: Exception) -> None:
    """The default reaction to a database error in the loop: log it, wait a little."""
    log.error("scheduler: %s; retrying in %.0fs", exc, SCHEDULER_RETRY)
    await asyncio.sleep(SCHEDULER_RETRY)


RETENTION_PERIOD = 86400.0      # seconds between two prunes of old history


async def prune_daily(store: Store, days: int, *, now: Callable[[], datetime] = SYSTEM.now,
                      sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                      on_store_error: OnStoreError | None = None, inbox: Inbox | None = None) -> None:
    """Forever (a daemon job): remove the history older than `days` (`Store.prune_history`: what is
    still queued or running stays) and the owner's inbox files of older days, at start and then every
    RETENTION_PERIOD. `now` and `sleep`: the clock and the wait, injected by tests. The audit log is
    not touched (only `ias audit --prune-before` prunes it)."""
    while True:
        before = now() - timedelta(days=days)
        try:
            removed = await store.prune_history(before)
        except StoreError as exc:
            await (on_store_error or retry_later)(exc)
            continue
        if inbox is not None:
            removed = {**removed, "inbox files": await asyncio.to_thread(inbox.prune, before)}
        if any(removed.values()):
            log.info("retention: removed what was older than %d days: %s", days,
                     ", ".join(f"{count} {table}" for table, count in removed.items()))
        await sleep(RETENTION_PERIOD)


# -- managing tasks (the `ias tasks` command and the task skills) -----------------------------

KINDS = ("reminder", "prompt")


class TaskError(ValueError):
    """A task request that cannot be carried out; the message says why."""


def _check(name: str, schedule: str, kind: str, text: str, created_at: datetime, now: datetime) -> datetime | None:
    if not name.strip():
        raise TaskError("a task needs a name")
    if kind not in KINDS:
        raise TaskError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not text.strip():
        raise TaskError("a task needs a text (the reminder, or the prompt for the assistant)")
    try:
        return next_run(schedule, created_at, now)
    except ValueError as exc:
        raise TaskError(str(exc)) from None


async def add_task(store: Store, user_id: str, name: str, schedule: str, kind: str, text: str,
                   now: datetime | None = None) -> Task:
    now = now or SYSTEM.now()
    following = _check(name, schedule, kind, text, now, now)
    if following is None:
        raise TaskError(f"the one-shot time {schedule!r} is already past")
    normal = parse_schedule(schedule).text
    return await store.add_task(user_id, name.strip(), normal, kind, text.strip(), following, now)


async def update_task(store: Store, task_id: int, *, name: str | None = None, schedule: str | None = None,
                      kind: str | None = None, text: str | None = None, now: datetime | None = None) -> Task:
    now = now or SYSTEM.now()
    task = await _existing(store, task_id)
    name, kind, text = name or task.name, kind or task.kind, text or task.text
    following = _check(name, schedule or task.schedule, kind, text, task.created_at, now)   # raises TaskError
    schedule = parse_schedule(schedule).text if schedule else task.schedule
    if following is None and task.enabled:
        raise TaskError(f"the one-shot time {schedule!r} is already past")
    enabled = task.enabled and following is not None
    updated = await store.update_task(task_id, name=name.strip(), schedule=schedule, kind=kind, text=text.strip(),
                                      enabled=enabled, next_run_at=following if enabled else None)
    return updated or await _existing(store, task_id)


async def set_enabled(store: Store, task_id: int, enabled: bool, now: datetime | None = None) -> Task:
    """Pause (no runs at all) or resume (from the next slot after now; missed ones are skipped)."""
    task = await _existing(store, task_id)
    try:
        following = next_run(task.schedule, task.created_at, now or SYSTEM.now()) if enabled else None
    except ValueError as exc:   # cron.CronError
        raise TaskError(str(exc)) from None
    if enabled and following is None:
        raise TaskError(f"task {task_id} is a one-shot whose time has passed; update its schedule first")
    updated = await store.update_task(task_id, name=task.name, schedule=task.schedule, kind=task.kind,
                                      text=task.text, enabled=enabled, next_run_at=following)
    return updated or await _existing(store, task_id)


async def remove_task(store: Store, task_id: int) -> None:
    if not await store.delete_task(task_id):
        raise TaskError(f"no task with id {task_id}")


async def _existing(store: Store, task_id: int) -> Task:
    task = await store.task(task_id)
    if task is None:
        raise TaskError(f"no task with id {task_id}")
    return task

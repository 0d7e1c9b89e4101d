"""The daemon's lifecycle: its single-instance lock, start-up and crash recovery, the background work
under one supervisor, hot reload of skills, the systemd watchdog, and the ordered stop.

Objects are built by `app.build`; this module only runs them. Not handled here: one-off
commands (`ias run`, `--once`: `oneoff`), restarts after a failure (the service manager's, on
exit status 1), more than one daemon per data directory (refused by the lock).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from . import systemd
from .app import build, make_inbox, open_llm, open_store, resolve_owner, wechat
from .changes import ADDED, LOWERED, MODIFIED, Change
from .channels.base import Channel
from .channels.console import ConsoleChannel
from .config import Config
from .errors import IasError, StoreError
from .limits import DB_LOST_LIMIT, SHUTDOWN_GRACE, SKILLS_SCAN_INTERVAL
from .locks import FileLock
from .monitor import DatabaseMonitor, DiskWatch
from .pgcluster import Cluster, embedded
from .processes import recover
from .registry import Registry
from .scheduler import Scheduler, prune_daily, retry_later
from .store import AuditEntry
from .supervisor import RECORDS, TASKS, TURNS, Supervisor

log = logging.getLogger(__name__)


@asynccontextmanager
async def instance_lock(config: Config) -> AsyncIterator[None]:
    """The daemon's single-instance lock: a flock on $IAS_DATA_DIR/daemon.lock, held while it runs."""
    lock = FileLock(config.daemon_lock)
    if not lock.acquire(wait=False):
        raise IasError(f"another iAs daemon is already running with data directory {config.data_dir.resolve()}; "
                       "stop it first")
    try:
        yield
    finally:
        lock.release()


async def run_daemon(config: Config, stdin=None, stdout=None, *, db_lost_limit: float = DB_LOST_LIMIT,
                     statvfs: Callable[[str], os.statvfs_result] = os.statvfs, cluster: Cluster | None = None) -> int:
    """The daemon: store and recovery, channels, agent; until SIGTERM/SIGINT/SIGHUP, or /exit or Ctrl-D on the
    console (exit 0), or a failure (exit 1).

    Every background task runs under one supervisor: one that crashes, or a database that stays
    unreachable past `db_lost_limit` seconds, stops the daemon with exit status 1 so that the
    service manager restarts it. On SIGTERM the running skills are ended first, then the calls
    record their results (within SHUTDOWN_GRACE), and only then are the turns cancelled. `statvfs`: how
    the free space under the data directory is measured (the owner is warned below 5 %).
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):     # SIGHUP: the terminal was closed
        loop.add_signal_handler(sig, stop.set)
    cluster = cluster or embedded(config)
    supervisor = Supervisor(daemon=True)
    async with (instance_lock(config), open_store(config, cluster, supervisor=supervisor) as store,
                open_llm(config) as llm):
        if llm is None:
            log.warning("OPENAI_API_KEY is not set: only /commands will work (run `python ias.py setup`)")
        monitor = DatabaseMonitor(store, supervisor.fail, restart=cluster.start if cluster else None,
                                  limit=db_lost_limit)
        user = await resolve_owner(config, store)
        console = ConsoleChannel(user, stdin=stdin, stdout=stdout, prompt=True)

        async def stale(note: str) -> None:
            await console.send(user, note)
        weixin = await wechat(config, store, supervisor, on_stale=stale)
        c = build(config, store, llm=llm, channels=[console] if weixin is None else [weixin, console],
                  primary=weixin or console, monitor=monitor, supervisor=supervisor)
        router, channels = c.router, c.router.channels
        for line in c.registry.problems:
            log.error("skill not loaded: %s", line)
        # Crash recovery: what a dead daemon or command left behind (never a re-run).
        await asyncio.to_thread(recover, c.runner.run_dir)
        c.gate.unwritten.path = config.unwritten_file     # the daemon's ends survive its restart
        await c.gate.unwritten.replay()             # ends a stopped daemon kept: written, never "interrupted"
        await c.gate.record_interrupted()
        leftovers = await c.approvals.expire_leftovers()
        await c.outbox.forget_unresumable()
        await store.audit(AuditEntry("daemon_start", detail=f"pid {os.getpid()}, {len(c.registry)} skills, "
                                                            f"channels {','.join(channels)}"))

        async def store_error(exc: Exception) -> None:
            if not await monitor.settle():          # the database is fine: an error of another kind
                await retry_later(exc)
        scheduler = Scheduler(store, router.run_task, on_store_error=store_error, supervisor=supervisor)
        stopped = False
        try:
            replayed = await router.replay()        # what a stop or crash left pending, before anything new
            if replayed:
                log.warning("replaying %d inbound message(s) left pending by the last run", replayed)
            for channel in channels.values():
                await channel.start(router.deliver)        # its own loops run under the supervisor
            for row in leftovers:
                await c.outbox.send(row.user_id, f"iAs 已重启，之前等待确认的操作已失效：{row.skill_name}",
                                    kind="notice")
            c.outbox.on_store_error = store_error
            supervisor.spawn(c.outbox.run(), "outbox")
            c.mcp.keep()                            # MCP servers start now, and come back when they die
            supervisor.spawn(monitor.run(), "database monitor")
            supervisor.spawn(scheduler.run(), "scheduler")
            supervisor.spawn(prune_daily(store, config.retention_days, on_store_error=store_error,
                                         inbox=make_inbox(config)), "retention")
            supervisor.spawn(_watchdog(systemd.watchdog_interval()), "watchdog")
            supervisor.spawn(watch_skills(c.registry, console, user,
                                          tell=lambda text: c.outbox.send(user, text, kind="notice")), "skills watcher")
            supervisor.spawn(DiskWatch(config.data_dir, lambda text: c.outbox.send(user, text, kind="notice"),
                                       statvfs=statvfs).run(), "disk watch")
            systemd.notify("READY=1\nSTATUS=serving")
            level = c.runner.sandbox.level()
            log.info("iAs is running (pid %d; channels: %s; sandbox: %s)", os.getpid(), ", ".join(channels),
                     level if level.full or level.name == "partial" else f"{level} ({level.missing})")
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(supervisor.failed.wait()),
                     asyncio.ensure_future(console.ended.wait())]       # /exit, or Ctrl-D on a terminal
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            stopped = True
        finally:
            systemd.notify("STOPPING=1")
            log.info("iAs is stopping%s", "" if stopped and not supervisor.failed.is_set() else " after a failure")
            for channel in channels.values():
                await channel.stop()
            await c.mcp.close()
            await c.runner.kill_all()                   # skills end first …
            # … their calls record how they ended, then the turns are cancelled, then the task runs, then the
            # rest; last, what the cancellations recorded (each step within SHUTDOWN_GRACE)
            await supervisor.close(SHUTDOWN_GRACE, order=(RECORDS, TURNS, TASKS))
            c.gate.unwritten.save()                     # what the database refused: for the next start
            try:
                await store.audit(AuditEntry("daemon_stop", detail=f"pid {os.getpid()}"
                                             + (f", {supervisor.reason}" if supervisor.reason else "")))
            except StoreError as exc:
                log.error("daemon_stop not recorded: %s", exc)
    return 1 if supervisor.failed.is_set() else 0


CHANGE_NOTES = {ADDED: "新增", LOWERED: "风险 High→Low 待重启生效", MODIFIED: "已修改"}


def change_note(change: Change) -> str:
    """The owner's message for one skill change (SPEC §5)."""
    return f"技能变更：{change.name}（{CHANGE_NOTES[change.kind]}）"


async def watch_skills(registry: Registry, console: Channel, user: str,
                       interval: float = SKILLS_SCAN_INTERVAL, *,
                       tell: Callable[[str], Awaitable[object]] | None = None) -> None:
    """Hot reload: a stat scan every `interval` s (the agent also scans before each turn); a skill
    edit that does not load is told to the owner once, on the console (its last good version stays).
    Every skill added or changed (by a reload or a server's new tool list) is told once through `tell`
    (the outbox, to the primary channel), else on the console; one that cannot be queued now is tried
    again at the next scan."""
    tell = tell or (lambda text: console.send(user, text))
    changes: list[Change] = []
    while True:
        if registry.reload():
            log.info("skills reloaded: %d loaded", len(registry))
        for line in registry.take_new_problems():
            await console.send(user, f"技能未能加载，沿用上一个可用版本（如有）：{line}")
        changes.extend(registry.take_changes())
        while changes:
            note = change_note(changes[0])
            try:
                await tell(note)
            except StoreError as exc:
                log.warning("skill change not told yet (%s): %s", exc, note)
                break
            log.info("skill change told to the owner: %s", note)
            changes.pop(0)
        await asyncio.sleep(interval)


async def _watchdog(interval: float | None) -> None:
    if interval is None:
        return
    while True:
        systemd.notify("WATCHDOG=1")
        await asyncio.sleep(interval)

"""The composition root: the only place iAs's objects are built and wired together."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Coroutine, Sequence

from . import ilink, sandbox, systemd
from .agent import APOLOGY, NO_LLM, TOOLS_REFUSED, Agent
from .approval import Approvals, Notify, load_key
from .auditchain import AuditChain
from .handlers import Handlers
from .changes import ADDED, LOWERED, MODIFIED, Change
from .channels.base import Channel, Inbound
from .channels.console import ConsoleChannel
from .channels.wechat import WeChatChannel
from .config import Config
from .errors import IasError, StoreError
from .gate import Gate
from .limits import DB_LOST_LIMIT, SHUTDOWN_GRACE, SKILLS_SCAN_INTERVAL, WECHAT_FIRST_POLL_WAIT
from .locks import FileLock
from .monitor import DatabaseMonitor, DiskWatch
from .notifiers import Fallback, configured
from .outbox import Outbox
from .pgcluster import Cluster
from .ranker import Catalog
from .router import Router
from .processes import recover
from .runner import Runner
from .scheduler import Scheduler, prune_daily, retry_later
from .mcp import Servers
from .registry import Registry, mcp_cache, registry
from .store import AuditEntry, Store
from .supervisor import Supervisor
from .unwritten import FILE as UNWRITTEN_FILE
from .wechat_login import credentials

if TYPE_CHECKING:
    from .llm import LLM            # imported for real only when there is an API key (see open_llm)

log = logging.getLogger(__name__)


@asynccontextmanager
async def open_store(config: Config, cluster: Cluster | None = None) -> AsyncIterator[Store]:
    """The configured database, or the embedded cluster (started if needed; stopped after only if no other
    iAs process uses it)."""
    chain = AuditChain.derive(load_key(config.key_file), config.audit_head)     # every writer's rows are keyed
    dsn = config.database_url
    if not dsn:
        cluster = cluster or Cluster(config.data_dir / "pg")
        dsn = cluster.start()
    try:
        store = await Store.open(dsn, chain=chain)
        try:
            yield store
        finally:
            await store.close()
    finally:
        if cluster is not None:
            cluster.stop()


DAEMON_LOCK = "daemon.lock"      # in $IAS_DATA_DIR


@asynccontextmanager
async def instance_lock(config: Config) -> AsyncIterator[None]:
    """The daemon's single-instance lock: a flock on $IAS_DATA_DIR/daemon.lock, held while it runs."""
    lock = FileLock(config.data_dir / DAEMON_LOCK)
    if not lock.acquire(wait=False):
        raise IasError(f"another iAs daemon is already running with data directory {config.data_dir.resolve()}; "
                       "stop it first")
    try:
        yield
    finally:
        lock.release()


@dataclass(frozen=True, slots=True)
class App:
    """iAs's objects for one process, wired once by `build`."""
    config: Config
    store: Store
    registry: Registry
    runner: Runner
    approvals: Approvals
    gate: Gate
    agent: Agent
    router: Router | None = None        # only when built with channels
    outbox: Outbox | None = None        # likewise
    mcp: Servers | None = None          # the MCP servers of the registry; `await app.mcp.close()` before exiting


def build(config: Config, store: Store, *, llm: LLM | None = None, key: bytes | None = None, now: Callable[[], datetime] | None = None,
          channels: Sequence[Channel] = (), primary: Channel | None = None, monitor: DatabaseMonitor | None = None,
          spawn: Callable[[Coroutine, str], asyncio.Task] | None = None, fallback: Fallback | None = None) -> App:
    """Everything `config` describes, over the opened `store`: the one place where iAs's objects are made.

    `llm` None: only /commands (one-off commands never import openai). `key` None: read from
    config.key_file. `now`: the agent's clock. With `channels`, a router over them that sends
    what nobody asked for (task results, restart notes) to `primary`, and an outbox every message to
    the owner goes through (its clock is `now` too; `fallback` None: the notifiers config names).
    """
    skills = registry(config)
    runner = make_runner(config)
    approvals = Approvals(store, load_key(config.key_file) if key is None else key, config.approval_timeout)
    catalog = Catalog(skills, config.max_tools, config.tools_bytes)
    mcp = Servers(skills, runner, mcp_cache(config), config.allow_risk_downgrade, tells_owner=bool(channels),
                  spawn=spawn)
    handlers = Handlers(store, skills, catalog.search)
    gate = Gate(skills, {"script": runner, "builtin": handlers, "mcp": mcp}, store, approvals, mcp)
    agent = Agent(skills, gate, store, llm, catalog=catalog, now=now, turn_timeout=config.turn_timeout,
                  monitor=monitor)
    router = outbox = None
    if channels:
        if primary is None:
            raise ValueError("a router needs its primary channel")
        by_name = {channel.name: channel for channel in channels}
        outbox = Outbox(store, by_name, primary.name, Fallback(configured(config)) if fallback is None else fallback,
                        expire=config.outbox_expire, fallback_after=config.fallback_after,
                        **({"now": now} if now is not None else {}))
        router = Router(approvals, agent, by_name, primary, outbox, monitor=monitor, spawn=spawn)
    return App(config, store, skills, runner, approvals, gate, agent, router, outbox, mcp)


def make_runner(config: Config) -> Runner:
    """The runner for `config` (also `skills check`'s, which starts MCP servers without a database).

    No database URL reaches a skill, even one naming it in ## Env: the task skills are built in.
    """
    environ = {**{k: v for k, v in config.environ.items() if k != "IAS_DATABASE_URL"},
               "IAS_DATA_DIR": str(config.data_dir.resolve())}
    return Runner(repo_root=config.repo_root, run_dir=config.data_dir / "runs", environ=environ,
                  python=sys.executable, sandbox=sandbox.for_config(config))


async def resolve_owner(config: Config, store: Store) -> str:
    """The owner's user id: IAS_OWNER, else the WeChat owner (env or stored login), else `owner`."""
    if config.owner or config.wechat_owner:
        return config.owner or config.wechat_owner
    stored = await store.get_state(ilink.CHANNEL, ilink.OWNER)
    return stored if isinstance(stored, str) and stored else "owner"


async def wechat(config: Config, store: Store, on_stale=None):
    """The WeChat channel when logged in (environment or stored login), else None."""
    creds = await credentials(store, config.wechat_token, config.wechat_owner, config.wechat_base_url)
    return None if creds is None else WeChatChannel(store, creds, on_stale=on_stale, window=config.wechat_window,
                                                    budget=config.wechat_budget)


@asynccontextmanager
async def open_llm(config: Config) -> AsyncIterator[LLM | None]:
    """The LLM client, closed on the way out; None without an API key (openai imported only when there is one)."""
    if not config.openai_api_key:
        yield None
        return
    from .llm import LLM
    llm = LLM(config.openai_api_key, config.openai_base_url, config.model, timeout=config.llm_timeout)
    try:
        yield llm
    finally:
        await llm.close()


@asynccontextmanager
async def owner_approvals(config: Config, c: App) -> AsyncIterator[tuple[str, Notify]]:
    """For `run` and `--once`: the owner, and how to ask them — WeChat when logged in, else the terminal.

    Over WeChat, replies arrive through the channel's long poll while the call waits; messages
    that are not approval replies are answered with a note (the daemon, not a one-off
    command, holds conversations). Without WeChat or a terminal nobody can answer: the
    notification fails, so the call ends as not confirmed, and stderr says why.
    """
    channel = await wechat(config, c.store)
    if channel is None:
        user = await resolve_owner(config, c.store)
        yield user, terminal_approvals(c.approvals, user)
        return
    user = config.owner or channel.owner

    async def answer(message: Inbound) -> None:
        reply = await c.approvals.redeem(message.user_id, message.text)
        await channel.send(message.user_id, reply or BUSY)
        if message.inbound_id is not None:          # answered here: the daemon does not take it up later
            await c.store.finish_inbound(message.inbound_id)

    async def notify(text: str) -> bool:
        await channel.caught_up(WECHAT_FIRST_POLL_WAIT)     # the owner's waiting message opens the window
        return await channel.send(user, text)
    await channel.start(answer)
    try:
        yield user, notify
    finally:
        await channel.stop()


BUSY = "iAs 正在执行一条命令行请求，这条消息没有处理，请稍后再发。"


def terminal_approvals(approvals: Approvals, user: str) -> Notify:
    """Ask on the terminal: the message on stderr, the reply read from stdin."""
    console = ConsoleChannel(user, stdout=sys.stderr)
    if not console.interactive():
        return _explain_no_confirm

    async def answer(message: Inbound) -> None:
        reply = await approvals.redeem(message.user_id, message.text)
        if reply:
            await console.send(user, reply)

    async def notify(text: str) -> bool:
        if not console.started:
            await console.start(answer)
        return await console.send(user, text)
    return notify


NO_CONFIRM = "ias: 无法请求确认：标准输入不是终端，且未登录微信；高风险调用按未确认处理"


async def run_once(config: Config, text: str) -> int:
    """`ias --once TEXT`: one turn for the owner; the reply on stdout."""
    async with open_store(config) as store, open_llm(config) as llm:
        c = build(config, store, llm=llm)
        if llm is None and not text.strip().startswith("/"):
            print(NO_LLM, file=sys.stderr)
            return 1
        try:
            async with owner_approvals(config, c) as (user, notify):
                reply = await c.agent.turn(user, text, notify)
        finally:
            await c.mcp.close()
        print(reply)
        return 1 if reply in (APOLOGY, TOOLS_REFUSED) else 0


async def _explain_no_confirm(text: str) -> bool:
    print(NO_CONFIRM, file=sys.stderr)
    return False


async def run_daemon(config: Config, stdin=None, stdout=None, *, db_lost_limit: float = DB_LOST_LIMIT,
                     statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> int:
    """The daemon: store and recovery, channels, agent; until SIGTERM/SIGINT (exit 0) or a failure (exit 1).

    Every background task runs under one supervisor: one that crashes, or a database that stays
    unreachable past `db_lost_limit` seconds, stops the daemon with exit status 1 so that the
    service manager restarts it. On SIGTERM the running skills are ended first, then the calls
    record their results (within SHUTDOWN_GRACE), and only then are the turns cancelled. `statvfs`: how
    the free space under the data directory is measured (the owner is warned below 5 %).
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cluster = None if config.database_url else Cluster(config.data_dir / "pg")
    async with instance_lock(config), open_store(config, cluster) as store, open_llm(config) as llm:
        if llm is None:
            log.warning("OPENAI_API_KEY is not set: only /commands will work")
        supervisor = Supervisor()
        monitor = DatabaseMonitor(store, supervisor.fail, restart=cluster.start if cluster else None,
                                  limit=db_lost_limit)
        user = await resolve_owner(config, store)
        console = ConsoleChannel(user, stdin=stdin, stdout=stdout)

        async def stale(note: str) -> None:
            await console.send(user, note)
        weixin = await wechat(config, store, on_stale=stale)
        c = build(config, store, llm=llm, channels=[console] if weixin is None else [weixin, console],
                  primary=weixin or console, monitor=monitor, spawn=supervisor.spawn)
        router, channels = c.router, c.router.channels
        for line in c.registry.problems:
            log.error("skill not loaded: %s", line)
        # Crash recovery: what a dead daemon or command left behind (never a re-run).
        await asyncio.to_thread(recover, c.runner.run_dir)
        c.gate.unwritten.path = config.data_dir / UNWRITTEN_FILE     # the daemon's ends survive its restart
        await c.gate.unwritten.replay()             # ends a stopped daemon kept: written, never "interrupted"
        await c.gate.record_interrupted()
        leftovers = await c.approvals.expire_leftovers()
        await c.outbox.forget_unresumable()
        await store.audit(AuditEntry("daemon_start", detail=f"pid {os.getpid()}, {len(c.registry)} skills, "
                                                            f"channels {','.join(channels)}"))

        async def store_error(exc: Exception) -> None:
            if not await monitor.settle():          # the database is fine: an error of another kind
                await retry_later(exc)
        scheduler = Scheduler(store, router.run_task, on_store_error=store_error, spawn=supervisor.spawn)
        stopped = False
        try:
            replayed = await router.replay()        # what a stop or crash left pending, before anything new
            if replayed:
                log.warning("replaying %d inbound message(s) left pending by the last run", replayed)
            for channel in channels.values():
                await channel.start(router.deliver)
                supervisor.spawn(channel.watch(), f"channel {channel.name}")
            for row in leftovers:
                await c.outbox.send(row.user_id, f"iAs 已重启，之前等待确认的操作已失效：{row.skill_name}",
                                    kind="notice")
            c.outbox.on_store_error = store_error
            supervisor.spawn(c.outbox.run(), "outbox")
            c.mcp.keep()                            # MCP servers start now, and come back when they die
            supervisor.spawn(monitor.run(), "database monitor")
            supervisor.spawn(scheduler.run(), "scheduler")
            supervisor.spawn(prune_daily(store, config.retention_days, on_store_error=store_error), "retention")
            supervisor.spawn(_watchdog(systemd.watchdog_interval()), "watchdog")
            supervisor.spawn(watch_skills(c.registry, console, user,
                                          tell=lambda text: c.outbox.send(user, text, kind="notice")), "skills watcher")
            supervisor.spawn(DiskWatch(config.data_dir, lambda text: c.outbox.send(user, text, kind="notice"),
                                       statvfs=statvfs).run(), "disk watch")
            systemd.notify("READY=1\nSTATUS=serving")
            level = c.runner.sandbox.level()
            log.info("iAs is running (pid %d; channels: %s; sandbox: %s)", os.getpid(), ", ".join(channels),
                     level if level.full or level.name == "partial" else f"{level} ({level.missing})")
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(supervisor.failed.wait())]
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
            await c.gate.drain(SHUTDOWN_GRACE)          # … their calls record how they ended …
            await router.cancel()                       # … then the turns are cancelled
            await scheduler.stop()
            await supervisor.cancel(SHUTDOWN_GRACE)
            await c.gate.drain(SHUTDOWN_GRACE)          # what the cancellations recorded
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

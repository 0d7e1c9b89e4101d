"""The composition root: the only place iAs's objects are built and wired together.

Building only. Not handled here: running what is built — the daemon's lifecycle is `daemon`,
one-off runs are `oneoff`, the command line is `cli`/`commands`/`doctor` (which construct
nothing themselves: what they need comes from the functions here).
"""
from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, AsyncIterator, Callable, Sequence

from . import sandbox
from .agent import Agent
from .approval import Approvals, load_key
from .auditchain import AuditChain
from .budget import Budget
from .handlers import Handlers
from .inbox import Inbox
from .memory import Memory
from .channels.base import Channel
from .channels.wechat import ilink
from .channels.wechat.cdn import CDN
from .channels.wechat.channel import WeChatChannel
from .channels.wechat.media import Media
from .channels.wechat.login import credentials
from .config import Config
from .gate import Gate
from .grants import Grants
from .monitor import DatabaseMonitor
from .notifiers import Fallback, configured
from .outbox import Outbox
from .pgcluster import Cluster, embedded
from .catalog import Catalog
from .router import Router
from .runner import Runner
from .status import Status
from .mcp.servers import Servers
from .registry import Registry, registry
from .store import Store
from .supervisor import Supervisor

if TYPE_CHECKING:
    from .llm import LLM, Models    # imported for real only when there is an API key (see open_llm)


@asynccontextmanager
async def open_store(config: Config, cluster: Cluster | None = None, *,
                     supervisor: Supervisor | None = None) -> AsyncIterator[Store]:
    """The configured database, or the embedded cluster (`cluster`, perhaps begun already, else the config's:
    started if needed, in a thread so that other tasks go on; left to linger, or stopped, only when no other
    iAs process uses it); `supervisor`: the daemon's, for the store's background work."""
    chain = AuditChain.derive(load_key(config.key_file), config.audit_head)     # every writer's rows are keyed
    dsn = config.database_url
    if not dsn:
        cluster = cluster or embedded(config)
        dsn = await asyncio.to_thread(cluster.start)
    try:
        store = await Store.open(dsn, chain=chain, supervisor=supervisor)
        try:
            yield store
        finally:
            await store.close()
    finally:
        if cluster is not None:
            cluster.stop()


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
    supervisor: Supervisor              # every background task of these objects; `close()` it before exiting
    router: Router | None = None        # only when built with channels
    outbox: Outbox | None = None        # likewise
    mcp: Servers | None = None          # the MCP servers of the registry; `await app.mcp.close()` before exiting


def build(config: Config, store: Store, *, llm: LLM | None = None, key: bytes | None = None, now: Callable[[], datetime] | None = None,
          channels: Sequence[Channel] = (), primary: Channel | None = None, monitor: DatabaseMonitor | None = None,
          supervisor: Supervisor | None = None, fallback: Fallback | None = None) -> App:
    """Everything `config` describes, over the opened `store`: the one place where iAs's objects are made.

    `llm` None: only /commands (one-off commands never import openai). `key` None: read from
    config.key_file. `now`: the agent's clock. With `channels`, a router over them that sends
    what nobody asked for (task results, restart notes) to `primary`, and an outbox every message to
    the owner goes through (its clock is `now` too; `fallback` None: the notifiers config names).
    `supervisor`: the daemon's; None: a new one (a one-off command's, a test's), `App.supervisor`.
    """
    supervisor = supervisor or Supervisor()
    skills = registry(config)
    runner = make_runner(config)
    key = load_key(config.key_file) if key is None else key
    grants = Grants(store, key, now)
    approvals = Approvals(store, key, config.approval_timeout, grants=grants)
    catalog = make_catalog(config, skills)
    mcp = Servers(skills, runner, config.mcp_cache, config.allow_risk_downgrade, tells_owner=bool(channels),
                  supervisor=supervisor)
    memory = Memory(store)
    handlers = Handlers(store, skills, catalog.search, memory)
    gate = Gate(skills, {"script": runner, "builtin": handlers, "mcp": mcp}, store, approvals, mcp,
                supervisor=supervisor, grants=grants)
    budget = Budget(store, config.daily_tokens, **({"now": now} if now is not None else {}))
    status = Status(config, store, budget, approvals, runner.sandbox, primary,
                    has_model=llm is not None, grants=grants, **({"now": now} if now is not None else {}))
    agent = Agent(skills, gate, store, llm, catalog=catalog, now=now, turn_timeout=config.turn_timeout,
                  monitor=monitor, budget=budget, status=status, inbox=make_inbox(config),
                  vision=bool(config.vision), memory=memory)
    router = outbox = None
    if channels:
        if primary is None:
            raise ValueError("a router needs its primary channel")
        by_name = {channel.name: channel for channel in channels}
        outbox = Outbox(store, by_name, primary.name, Fallback(configured(config)) if fallback is None else fallback,
                        expire=config.outbox_expire, fallback_after=config.fallback_after,
                        supervisor=supervisor, outgoing=config.outgoing, **({"now": now} if now is not None else {}))
        router = Router(approvals, agent, by_name, primary, outbox, supervisor=supervisor, monitor=monitor)
    return App(config, store, skills, runner, approvals, gate, agent, supervisor, router, outbox, mcp)


def make_catalog(config: Config, skills: Registry) -> Catalog:
    """The tool catalog over `skills`: the agent's, and what `skills check` and doctor count against one request."""
    return Catalog(skills, config.max_tools, config.tools_bytes)


@asynccontextmanager
async def open_servers(config: Config, skills: Registry) -> AsyncIterator[Servers]:
    """The MCP servers of `skills` alone, without a database or channels (`skills check`, doctor); all stopped
    on the way out."""
    servers = Servers(skills, make_runner(config), config.mcp_cache, config.allow_risk_downgrade)
    try:
        yield servers
    finally:
        await servers.close()


def make_runner(config: Config) -> Runner:
    """The runner for `config` (also `skills check`'s, which starts MCP servers without a database).

    No database URL reaches a skill, even one naming it in ## Env: the task skills are built in.
    """
    environ = {**{k: v for k, v in config.environ.items() if k != "IAS_DATABASE_URL"},
               "IAS_DATA_DIR": str(config.data_dir.resolve())}
    return Runner(repo_root=config.repo_root, run_dir=config.run_dir, environ=environ,
                  python=sys.executable, sandbox=sandbox.for_config(config), outgoing=config.outgoing,
                  inbox=config.inbox)


async def resolve_owner(config: Config, store: Store) -> str:
    """The owner's user id: IAS_OWNER, else the WeChat owner (env or stored login), else `owner`."""
    if config.owner or config.wechat_owner:
        return config.owner or config.wechat_owner
    stored = await store.get_state(ilink.CHANNEL, ilink.OWNER)
    return stored if isinstance(stored, str) and stored else "owner"


async def wechat(config: Config, store: Store, supervisor: Supervisor, on_stale=None):
    """The WeChat channel when logged in (environment or stored login), else None; its tasks run under
    `supervisor`."""
    creds = await credentials(store, config.wechat_token, config.wechat_owner, config.wechat_base_url)
    return None if creds is None else WeChatChannel(store, creds, on_stale=on_stale, window=config.wechat_window,
                                                    budget=config.wechat_budget, supervisor=supervisor,
                                                    media=Media(CDN(config.wechat_cdn_url), make_inbox(config)))


def make_inbox(config: Config) -> Inbox:
    """The owner's inbox (`config.inbox`), bounded by IAS_INBOX_MAX_MB."""
    return Inbox(config.inbox, config.inbox_max_mb * 1024 * 1024)


@asynccontextmanager
async def open_llm(config: Config) -> AsyncIterator[Models | None]:
    """The model chain (`llm_chain`), closed on the way out; None without an API key (openai imported only
    when there is one)."""
    if not config.openai_api_key:
        yield None
        return
    llm = llm_chain(config)
    try:
        yield llm
    finally:
        await llm.close()


def llm_chain(config: Config, retry_delays: tuple[float, ...] | None = None) -> Models:
    """The primary model, then IAS_FALLBACK_MODELS' in order, each with its own key, retries and
    IAS_LLM_TIMEOUT; `retry_delays` None: the default ones (tests pass short ones)."""
    from .llm import LLM, Models
    delays = {} if retry_delays is None else {"retry_delays": retry_delays}
    return Models(LLM(config.openai_api_key, config.openai_base_url, config.model, timeout=config.llm_timeout, **delays),
                  tuple(LLM(e.key, e.base_url, e.model, timeout=config.llm_timeout, key_from=e.key_from, **delays)
                        for e in config.fallback_models))

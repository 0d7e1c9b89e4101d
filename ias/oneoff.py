"""One-off runs: `ias --once TEXT` (one turn) and the owner's approvals for it and for `ias run`.

The owner is asked over WeChat when logged in, else on the terminal. Not handled here: holding
conversations (a message that is not an approval reply gets a note: the daemon converses), and
asking anyone when there is neither WeChat nor a terminal (the call ends as not confirmed).
"""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from typing import AsyncIterator

from .agent import APOLOGY, KEY_REFUSED_HEAD, NO_LLM, TOOLS_REFUSED
from .app import App, build, open_llm, open_store, resolve_owner, wechat
from .approval import Approvals, Notify
from .channels.base import Inbound
from .channels.console import ConsoleChannel
from .config import Config
from .limits import SHUTDOWN_GRACE, WECHAT_FIRST_POLL_WAIT
from .pgcluster import Cluster
from .slash import is_command
from .supervisor import RECORDS


@asynccontextmanager
async def owner_approvals(config: Config, c: App) -> AsyncIterator[tuple[str, Notify]]:
    """For `run` and `--once`: the owner, and how to ask them — WeChat when logged in, else the terminal.

    Over WeChat, replies arrive through the channel's long poll while the call waits; messages
    that are not approval replies are answered with a note (the daemon, not a one-off
    command, holds conversations). Without WeChat or a terminal nobody can answer: the
    notification fails, so the call ends as not confirmed, and stderr says why.
    """
    channel = await wechat(config, c.store, c.supervisor)
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


async def run_once(config: Config, text: str, cluster: Cluster | None = None) -> int:
    """`ias --once TEXT`: one turn for the owner; the reply on stdout. `cluster`: the embedded cluster, perhaps
    begun already (see cli, which has loaded the SDK meanwhile when `asks_model`); the client is made before the
    store opens."""
    async with open_llm(config) as llm:
        if llm is not None and asks_model(config, text):
            llm.warm()
        async with open_store(config, cluster) as store:
            c = build(config, store, llm=llm)
            if llm is None and not is_command(text):
                print(NO_LLM, file=sys.stderr)
                return 1
            try:
                async with owner_approvals(config, c) as (user, notify):
                    reply = await c.agent.turn(user, text, notify)
            finally:
                await finish(c)
            print(reply)
            return 1 if reply in (APOLOGY, TOOLS_REFUSED) or reply.startswith(KEY_REFUSED_HEAD) else 0


def asks_model(config: Config, text: str) -> bool:
    """Whether a `--once` of `text` is sure to ask the model: an API key is set and it is not a /command."""
    return bool(config.openai_api_key) and not is_command(text)


async def finish(c: App) -> None:
    """The end of a one-off run: its MCP servers stopped, the records its calls started written (within
    SHUTDOWN_GRACE), the rest of its background work cancelled. A task that crashed meanwhile was logged
    with its traceback by the supervisor; the exit status stays the run's own."""
    await c.mcp.close()
    await c.supervisor.close(SHUTDOWN_GRACE, order=(RECORDS,))


async def _explain_no_confirm(text: str) -> bool:
    print(NO_CONFIRM, file=sys.stderr)
    return False

"""The inbound router: approval replies to the approval, everything else to the agent, one turn at a time.

While a user has a pending approval, their messages go to it and never reach the model. A
code-shaped message with nothing pending is intercepted too, so a late or mistyped code never
lands in the model's context. While the database is lost (see monitor.py) every message gets
one short answer instead of a turn.

One user's messages are handled in the order they arrived, whatever each looks up first (SPEC 8,
"Order"); their replies are queued in that order too. The exceptions are the answers that cannot
wait: an approval reply answers the turn that waits for it, a reply that releases a held
confirmation message or says 继续 only lets out what waits, and the database-down answer comes at
once. Different users never wait for each other. Scheduled prompt tasks run their turns in a lane
of their own (one at a time per user), so they never make the owner's own messages wait.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Callable, Coroutine

from .agent import Agent
from .approval import Approvals, parse_reply
from .channels.base import Channel, Inbound
from .errors import StoreError
from .locks import Place, UserLocks
from .outbox import Outbox

log = logging.getLogger(__name__)

FAILED = "抱歉，处理这条消息时出错了，请稍后再试。"
SKILL_LINE = re.compile(r"^技能：(.*)$", re.M)        # the confirmation message's own (code-rendered) skill line
NOTHING_PENDING = "当前没有等待确认的操作。"
DB_DOWN = "数据库暂时不可用，请稍后再试。"


class Router:
    """Dispatches inbound messages from every channel; replies go back on the channel they came from."""

    def __init__(self, approvals: Approvals, agent: Agent, channels: dict[str, Channel], primary: Channel,
                 outbox: Outbox, *, monitor=None, spawn: Callable[[Coroutine, str], asyncio.Task] | None = None):
        if channels.get(primary.name) is not primary:
            raise ValueError(f"the primary channel {primary.name!r} is not one of the channels")
        self.approvals = approvals
        self.agent = agent
        self.channels = channels
        self.primary = primary        # where messages nobody asked for go (task results, restart notes)
        self.monitor = monitor        # the DatabaseMonitor, in the daemon
        self.outbox = outbox          # every message to the owner goes through it
        self._spawn = spawn or (lambda coro, name: asyncio.create_task(coro, name=name))
        self._arrivals = UserLocks()    # what a message looks up first, in the order messages came
        self._turns = UserLocks()       # turns (and answers given in turn), in the same order
        self._task_turns = UserLocks()  # scheduled prompt tasks: a lane of their own, one at a time per user
        self._tasks: set[asyncio.Task] = set()

    @property
    def users_in_turn(self) -> int:
        """How many users have a turn running or waiting (none once every turn has ended)."""
        return len(self._turns)

    @property
    def dispatching(self) -> int:
        """How many inbound messages are being handled right now."""
        return len(self._tasks)

    async def dispatch(self, message: Inbound) -> None:
        """Handle one message, after the user's earlier ones; never raises (a failure is logged and the
        owner told briefly).

        Two lines per user keep the order: `_arrivals`, whose place is taken before the first await (so
        in the order the channel delivered the messages), covers what a message looks up first; a
        message that needs a turn takes its place in `_turns` before it lets the next one look anything
        up. An approval reply never waits for a turn: the turn it answers holds the turn lock meanwhile.
        """
        arrival = self._arrivals.place(message.user_id)
        place = None
        async with arrival:
            channel = self.channels[message.channel]
            try:
                place = await self._sort(message, channel)
                arrival.release()       # in line for its turn: the next message may look things up
                if place is not None:
                    async with place:
                        await self._handle(message, channel)
            except asyncio.CancelledError:
                raise
            except StoreError as exc:
                log.error("handling a message from %s on %s failed: %s", message.user_id, message.channel, exc)
                if self.monitor is not None:
                    self.monitor.suspect()
                await _answer(channel, message.user_id, DB_DOWN)
            except Exception:
                log.exception("handling a message from %s on %s failed", message.user_id, message.channel)
                await _answer(channel, message.user_id, FAILED)
            finally:
                if place is not None:
                    place.release()

    async def _sort(self, message: Inbound, channel: Channel) -> Place | None:
        """What must happen at once (the database is down, a held confirmation message or an approval
        reply); otherwise the message's place in the user's turn line."""
        if self.monitor is not None and not self.monitor.available:
            await _answer(channel, message.user_id, DB_DOWN)
            return None
        if await self.outbox.inbound(message.user_id, message.channel, message.text):
            return None                 # it released a held confirmation message, or only said 继续
        answer = await self.approvals.redeem(message.user_id, message.text)
        if answer is not None:
            await self.outbox.send(message.user_id, answer, channel.name)
            return None
        return self._turns.place(message.user_id)

    async def _handle(self, message: Inbound, channel: Channel) -> None:
        """In the user's turn: a code-shaped message is intercepted (nothing was pending when it came, and
        a code never reaches the model); anything else is an agent turn, its reply queued before the next
        turn starts (so replies keep their order)."""
        if parse_reply(message.text) == "code":
            await self.outbox.send(message.user_id, NOTHING_PENDING, channel.name)
            return
        reply = await self._agent_turn(message.user_id, message.text, channel)
        if reply:
            await self.outbox.send(message.user_id, reply, channel.name)

    async def turn(self, user_id: str, text: str, channel: Channel) -> str:
        """One agent turn for `user_id` (a scheduled task's prompt), after their other task turns; approvals go
        to `channel`. Task turns run in a lane of their own, beside the owner's messages: a hundred due
        prompt tasks never make the owner's own message wait (each turn stores its history in one piece,
        so turns side by side do not interleave it; approvals queue per user)."""
        async with self._task_turns.hold(user_id):
            return await self._agent_turn(user_id, text, channel)

    async def _agent_turn(self, user_id: str, text: str, channel: Channel) -> str:
        """The agent's turn, its confirmation messages sent on `channel`; the caller holds the turn lock."""
        async def notify(message: str) -> bool | asyncio.Event:
            if not channel.can_confirm():
                log.warning("cannot ask %s for a confirmation on the %s channel (no terminal)", user_id, channel.name)
                return False
            skill = SKILL_LINE.search(message)
            return await self.outbox.urgent(user_id, channel.name, message, skill.group(1) if skill else "?",
                                            self.approvals.timeout)
        return await self.agent.turn(user_id, text, notify)

    async def run_task(self, task, run_id: int | None = None) -> str:
        """A scheduled task: a reminder is sent as is; a prompt runs as a turn and its reply is sent.

        Sent through the outbox: what the channel cannot take now waits there (and may go to the
        fallback notifiers); the run's delivery column says which.
        """
        text = task.text if task.kind == "reminder" else await self.turn(
            task.user_id, f"（定时任务「{task.name}」）{task.text}", self.primary)
        await self.outbox.send(task.user_id, text, self.primary.name, "reminder" if task.kind == "reminder" else "task",
                               due=task.next_run_at, run_id=run_id)
        return text

    async def deliver(self, message: Inbound) -> None:
        """The channels' callback: dispatch as a task of the router's own (supervised in the daemon),
        tracked so that shutdown can cancel it; cancelling the caller does not cancel the turn."""
        task = self._spawn(self.dispatch(message), f"turn {message.channel}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.wait([task])

    async def cancel(self) -> None:
        """Shutdown: cancel turns in flight."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _answer(channel: Channel, user_id: str, text: str) -> None:
    """A short answer after a failure; it failing too is only logged (the database may be gone)."""
    try:
        await channel.send(user_id, text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error("could not answer %s on %s: %s", user_id, channel.name, exc)

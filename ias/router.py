"""The inbound router: approval replies to the approval, everything else to the agent, one turn at a time.

While a user has a pending approval, their messages go to it and never reach the model. A
code-shaped message with nothing pending is intercepted too, so a late or mistyped code never
lands in the model's context.

Nothing the owner sent is lost (SPEC 15): a message is recorded in the store's `inbound` table on
arrival (by the channel when it has ids to de-duplicate, else here) and marked done only once its
outcome is stored (its reply queued in the outbox, or an approval reply applied); what a restart, a
SIGTERM or a crash left pending is replayed at the next start (`replay`), before anything new. While
the database is lost (see monitor.py) messages are held in memory, up to INBOUND_HELD_MAX, the owner
told once (HELD), and handled when it returns — a code too. A step that meets the outage mid-way is
done again then, except the end of a turn: its reply, once made, is kept (and stored, and queued) rather
than the turn run again. Past the bound a message gets DB_DOWN, as does one without a monitor.

One user's messages are handled in the order they arrived, whatever each looks up first (SPEC 8,
"Order"); their replies are queued in that order too. The exceptions are the answers that cannot
wait: an approval reply answers the turn that waits for it, a reply that releases a held
confirmation message or says 继续 only lets out what waits, and the database-down answers come at
once. Different users never wait for each other, except for the bound on agent turns running at
once (TURNS_MAX): a turn beyond it waits for a slot, in the order the turns came, and is never dropped.
Scheduled prompt tasks run their turns in a lane of their own (one at a time per user, outside that
bound), so they never make the owner's own messages wait. Each message is handled in a task of the
supervisor's TURNS group, which the daemon's stop cancels (after the calls in them recorded their end).

The stop word (`停止`, `stop`, `/stop`; stopping.py) comes before all of this: it is handled at once,
overtaking the user's queued messages, and ends their turns (each turn runs in `Stops.running`), their
pending approval and the messages queued behind (dropped, marked handled). A stopped turn's message is
stored in the history with the reply STOPPED and marked handled; it is not answered on its own (the stop
word's answer is the one).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Awaitable, Callable

from .agent import Agent
from .approval import Approvals, parse_reply
from .channels.base import Channel, Inbound
from .errors import StoreError
from .inbox import attachments
from .limits import INBOUND_HELD_MAX, INBOUND_REPLAYS_MAX, TURNS_MAX
from .locks import Place, UserLocks
from .outbox import Outbox
from .stopping import STOPPED, Stopped, Stops, Ticket, is_stop
from .supervisor import TURNS, Supervisor

log = logging.getLogger(__name__)

FAILED = "抱歉，处理这条消息时出错了，请稍后再试。"
NOTHING_PENDING = "当前没有等待确认的操作。"
DB_DOWN = "数据库暂时不可用，请稍后再试。"
HELD = "数据库暂时不可用，恢复后会处理你的消息。"
GIVEN_UP = "iAs 重启了 {n} 次仍未处理完这条消息，已跳过：{text}"


class Router:
    """Dispatches inbound messages from every channel; replies go back on the channel they came from."""

    def __init__(self, approvals: Approvals, agent: Agent, channels: dict[str, Channel], primary: Channel,
                 outbox: Outbox, *, supervisor: Supervisor, monitor=None, turns_max: int = TURNS_MAX):
        if channels.get(primary.name) is not primary:
            raise ValueError(f"the primary channel {primary.name!r} is not one of the channels")
        self.approvals = approvals
        self.agent = agent
        self.channels = channels
        self.primary = primary        # where messages nobody asked for go (task results, restart notes)
        self.monitor = monitor        # the DatabaseMonitor, in the daemon
        self.outbox = outbox          # every message to the owner goes through it
        self.store = outbox.store
        self.turns = supervisor.scope(TURNS, limit=turns_max)     # messages being handled; agent turns take a slot
        self._arrivals = UserLocks()    # what a message looks up first, in the order messages came
        self._turns = UserLocks()       # turns (and answers given in turn), in the same order
        self._task_turns = UserLocks()  # scheduled prompt tasks: a lane of their own, one at a time per user
        self._held = 0                                  # messages that came while the database was lost
        self._holding: set[tuple[str, str]] = set()     # their (channel, message id): a redelivery is not held twice
        self._told: set[str] = set()                    # users told HELD in this outage
        self.stops = Stops(approvals, agent.gate, outbox, monitor)      # the stop word and what it ends

    @property
    def users_in_turn(self) -> int:
        """How many users have a turn running or waiting (none once every turn has ended)."""
        return len(self._turns)

    @property
    def dispatching(self) -> int:
        """How many inbound messages are being handled right now."""
        return self.turns.active

    async def dispatch(self, message: Inbound) -> None:
        """Handle one message, after the user's earlier ones; never raises (a failure is logged and the
        owner told briefly).

        Two lines per user keep the order: `_arrivals`, whose place is taken before the first await (so
        in the order the channel delivered the messages), covers recording the message and what it looks
        up first; a message that needs a turn takes its place in `_turns` before it lets the next one look
        anything up. An approval reply never waits for a turn: the turn it answers holds the turn lock
        meanwhile. A message that came while the database is lost waits in its arrival line (held).
        """
        channel = self.channels[message.channel]
        if is_stop(message.text):       # before anything else, even the database: it overtakes the queue
            if not await self.stops.stop(message, channel):
                await _answer(channel, message.user_id, STOPPED)        # the database is lost: best effort
            return
        key = None if message.message_id is None else (message.channel, message.message_id)
        outage = self.monitor is not None and not self.monitor.available
        if outage and message.inbound_id is None and key in self._holding:
            log.info("message %s on %s is already held", message.message_id, message.channel)
            return
        if outage and self._held >= INBOUND_HELD_MAX:
            log.error("database lost and %d messages held: %s on %s answered and dropped", self._held,
                      message.message_id, message.channel)
            await _answer(channel, message.user_id, DB_DOWN)
            return
        arrival = self._arrivals.place(message.user_id)
        ticket = self.stops.enter(message.user_id)
        place = recorded = None
        held = self._hold(key) if outage else None
        try:
            if held is not None:
                await self._tell_held(message.user_id, channel)
            async with arrival:
                recorded = await self._admit(message, channel)
                if held is not None:
                    held()
                    held = None         # admitted: no longer held
                if recorded is None:
                    return
                ticket.inbound_id = recorded.inbound_id
                if not ticket.stopped:
                    place = await self._patiently(lambda: self._sort(recorded, channel), recorded, channel)
                arrival.release()       # in line for its turn: the next message may look things up
                if place is not None:
                    async with place:
                        for_owner: list = []        # the turn's files for the owner, queued after its reply
                        reply = await self._patiently(lambda: self._handle(recorded, channel, ticket, for_owner),
                                                      recorded, channel)
                        self.stops.leave(ticket)        # its turn is over: a stop from now on leaves it be
                        if reply:       # kept through an outage: the turn is not run again for it
                            await self._patiently(lambda: self.outbox.send(
                                recorded.user_id, reply, channel.name, inbound_id=recorded.inbound_id, files=for_owner),
                                recorded, channel)
                await self._finish(recorded)        # when no reply marked it handled already
        except asyncio.CancelledError:
            raise                       # shutdown: the message stays pending, replayed at the next start
        except StoreError as exc:
            log.error("handling a message from %s on %s failed: %s", message.user_id, message.channel, exc)
            if self.monitor is not None:
                self.monitor.suspect()
            await _answer(channel, message.user_id, DB_DOWN)
        except Exception:
            log.exception("handling a message from %s on %s failed", message.user_id, message.channel)
            await _answer(channel, message.user_id, FAILED)
            await self._finish(message if recorded is None else recorded)     # told: not replayed at every start
        finally:
            self.stops.leave(ticket)
            if held is not None:
                held()
            if place is not None:
                place.release()

    def _hold(self, key: tuple[str, str] | None) -> Callable[[], None]:
        """Count a message held while the database is lost; what to call once when it is no longer held."""
        self._held += 1
        if key is not None:
            self._holding.add(key)

        def release() -> None:
            self._held -= 1
            self._holding.discard(key)
        return release

    async def _admit(self, message: Inbound, channel: Channel) -> Inbound | None:
        """The message as recorded (pending), once the database is there; None for a redelivery."""
        if self.monitor is not None and not self.monitor.available:
            await self._tell_held(message.user_id, channel)
            await self.monitor.back()
        if message.inbound_id is None:
            inbound_id = await self._patiently(lambda: self.store.record_inbound(
                message.channel, message.user_id, message.message_id, message.text,
                [a.record() for a in message.attachments]), message, channel)
            if inbound_id is None:
                log.info("message %s on %s was already handled", message.message_id, message.channel)
                return None
            message = replace(message, inbound_id=inbound_id)
        self._told.discard(message.user_id)
        return message

    async def _patiently(self, step: Callable[[], Awaitable], message: Inbound, channel: Channel):
        """`step()`, done again after each outage of the database it meets (the message held meanwhile, the
        owner told once); without a monitor a StoreError propagates."""
        if self.monitor is None:
            return await step()

        async def waiting(exc: StoreError) -> None:
            log.warning("message from %s on %s waits for the database: %s", message.user_id, message.channel, exc)
            await self._tell_held(message.user_id, channel)
        return await self.monitor.through(step, waiting)

    async def _tell_held(self, user_id: str, channel: Channel) -> None:
        if user_id not in self._told:
            self._told.add(user_id)
            await _answer(channel, user_id, HELD)

    async def _finish(self, message: Inbound) -> None:
        """Mark the message handled; if that fails it stays pending (replayed at the next start)."""
        if message.inbound_id is not None:
            try:
                await self.store.finish_inbound(message.inbound_id)
            except StoreError as exc:
                log.error("could not mark inbound message %d handled: %s", message.inbound_id, exc)

    async def _sort(self, message: Inbound, channel: Channel) -> Place | None:
        """What must happen at once (a held confirmation message or an approval reply); otherwise the
        message's place in the user's turn line."""
        if await self.outbox.inbound(message.user_id, message.channel, message.text):
            return None                 # it released a held confirmation message, or only said 继续
        answer = await self.approvals.redeem(message.user_id, message.text)
        if answer is not None:
            await self.outbox.send(message.user_id, answer, channel.name, inbound_id=message.inbound_id)
            return None
        return self._turns.place(message.user_id)

    async def _handle(self, message: Inbound, channel: Channel, ticket: Ticket,
                      for_owner: list | None = None) -> str | None:
        """In the user's turn, the reply (queued by the caller before the next turn starts, so replies keep
        their order): a code-shaped message is intercepted (nothing was pending when it came, and a code
        never reaches the model); anything else is an agent turn. None: stopped (nothing to answer)."""
        if ticket.stopped:
            return None                 # a stop word came while it waited: dropped, never shown to the model
        if parse_reply(message.text) == "code":
            return NOTHING_PENDING
        async with self.turns.slot():       # at most TURNS_MAX at once; the user's later messages wait behind
            return await self._agent_turn(message.user_id, message.text, channel, ticket, message.attachments,
                                          for_owner=for_owner)

    async def turn(self, user_id: str, text: str, channel: Channel, task_id: int | None = None, *,
                   for_owner: list | None = None) -> str | None:
        """One agent turn for `user_id` (a scheduled task's prompt), after their other task turns; approvals go
        to `channel`. Task turns run in a lane of their own, beside the owner's messages: a hundred due
        prompt tasks never make the owner's own message wait (each turn stores its history in one piece,
        so turns side by side do not interleave it; approvals queue per user). None: stopped by the stop word."""
        ticket = self.stops.enter(user_id)
        try:
            async with self._task_turns.hold(user_id):
                return await self._agent_turn(user_id, text, channel, ticket, task_id=task_id, for_owner=for_owner)
        finally:
            self.stops.leave(ticket)

    async def _agent_turn(self, user_id: str, text: str, channel: Channel, ticket: Ticket, files=(),
                          task_id: int | None = None, *, for_owner: list | None = None) -> str | None:
        """The agent's turn, its confirmation messages sent on `channel`; the caller holds the turn lock. None
        when the stop word ended it (or came before it began): a turn it ended is stored with the reply STOPPED."""
        if ticket.stopped:
            return None
        async def notify(message: str) -> bool | asyncio.Event:
            if not channel.can_confirm():
                log.warning("cannot ask %s for a confirmation on the %s channel (no terminal)", user_id, channel.name)
                return False
            return await self.outbox.urgent(user_id, channel.name, message, self.approvals.asking(user_id) or "?",
                                            self.approvals.timeout)
        try:
            with self.stops.running(ticket):
                return await self.agent.turn(user_id, text, notify, files, for_owner=for_owner, task_id=task_id)
        except Stopped:
            log.info("the turn of %s was stopped", user_id)
            await self.agent.stopped(user_id, text, STOPPED)
            return None

    async def run_task(self, task, run_id: int | None = None) -> str:
        """A scheduled task: a reminder is sent as is; a prompt runs as a turn and its reply is sent.

        Sent through the outbox: what the channel cannot take now waits there (and may go to the
        fallback notifiers); the run's delivery column says which. A prompt the stop word ended sends nothing
        (the owner was answered STOPPED) and the run's reply says STOPPED.
        """
        for_owner: list = []
        text = task.text if task.kind == "reminder" else await self.turn(
            task.user_id, f"（定时任务「{task.name}」）{task.text}", self.primary, task.id, for_owner=for_owner)
        if text is None:
            return STOPPED
        await self.outbox.send(task.user_id, text, self.primary.name, "reminder" if task.kind == "reminder" else "task",
                               due=task.next_run_at, run_id=run_id, files=for_owner)
        return text

    async def deliver(self, message: Inbound) -> None:
        """The channels' callback: dispatch as a task of the supervisor's TURNS group (which shutdown
        cancels); cancelling the caller does not cancel the turn."""
        await asyncio.wait([self._launch(message)])

    def _launch(self, message: Inbound) -> asyncio.Task:
        return self.turns.spawn(self.dispatch(message), f"turn {message.channel}")

    async def replay(self) -> int:
        """At start, before the channels: the messages a restart, a SIGTERM or a crash left pending, each
        dispatched again in the order they came (so before anything new of their user); how many.

        Only for channels whose owner is still there after a restart (`resumable`, as the outbox keeps
        only their replies): a console line is forgotten. One that INBOUND_REPLAYS_MAX starts did not
        finish (it may be what stops them) is given up, and the owner told."""
        replayed = []
        for row in await self.store.pending_inbound():
            channel = self.channels.get(row.channel)
            if channel is None or not channel.resumable:
                log.warning("inbound message %d on %s left pending by the last run is not replayed (the channel "
                            "does not outlive a restart)", row.id, row.channel)
                await self.store.finish_inbound(row.id)
            elif row.replays >= INBOUND_REPLAYS_MAX:
                log.error("inbound message %d from %s was not finished by %d starts: given up", row.id, row.user_id,
                          row.replays)
                await self.outbox.send(row.user_id, GIVEN_UP.format(n=row.replays, text=row.text[:50]),
                                       channel.name, kind="notice", inbound_id=row.id)
            else:
                replayed.append(row)
        await self.store.count_replays([row.id for row in replayed])
        for row in replayed:
            log.info("replaying inbound message %d from %s on %s (received %s)", row.id, row.user_id,
                     row.channel, row.received_at.isoformat(timespec="seconds"))
            self._launch(Inbound(row.channel, row.user_id, row.text, row.message_id, row.id,
                                 attachments(row.attachments)))
        return len(replayed)

    async def cancel(self) -> None:
        """Cancel the turns in flight and wait for them (the daemon's stop does this through `Supervisor.close`)."""
        await self.turns.cancel()


async def _answer(channel: Channel, user_id: str, text: str) -> None:
    """A short answer after a failure; it failing too is only logged (the database may be gone)."""
    try:
        await channel.send(user_id, text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error("could not answer %s on %s: %s", user_id, channel.name, exc)

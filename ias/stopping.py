"""The stop word (SPEC 12): `停止`, `stop` or `/stop` ends at once what the owner's messages set going.

The router hands a stop word here before anything else, even while the user's turn runs and ahead of
their queued messages (the one exception to SPEC 8's order). For that user, `Stops.stop`:
- cancels their running agent turns (the owner's own and a scheduled prompt task's): no further
  model call. A skill call in a turn is cancelled with it, so the runner kills the skill's whole
  process group and the gate records its `skill_finished` as `cancelled`;
- rejects their pending approval (audit detail `stop`);
- drops their messages queued behind the turn: marked handled at once (never replayed) and never
  shown to the model;
- answers STOPPED through the outbox, also when nothing was running, and writes one `stop` audit row
  saying what it stopped.

Each message being handled holds a `Ticket` from `Stops.enter` until its turn is over; a turn runs
inside `Stops.running(ticket)`, which turns the stop's cancellation into `Stopped` and leaves every
other cancellation (the daemon's shutdown) a cancellation, so a shutdown still leaves the message
pending for replay. With the database lost the stop still cancels what runs in this process, and the
router answers on the channel directly; the queued messages it could not mark are marked when they
reach the database (they are dropped there too).

Not handled: another user's work; a skill run by a one-off `ias run` (another process); a message
already being applied outside a turn (an approval reply, a 继续) — it finishes. A pending approval the
stop could not reject (the database lost) stays pending in the table until the next start expires
it; its call never runs (its turn is gone), but meanwhile that user's next High call is not asked.
"""
from __future__ import annotations

import asyncio
import logging
import unicodedata
from contextlib import contextmanager
from typing import Iterator

from .approval import Approvals
from .channels.base import Channel, Inbound
from .errors import StoreError
from .gate import Gate
from .outbox import Outbox
from .store import AuditEntry

log = logging.getLogger(__name__)

STOPPED = "已停止。"
WORDS = frozenset({"停止", "stop", "/stop"})


def is_stop(text: str) -> bool:
    """Whether `text` is the stop word: after NFKC, trimmed, trailing punctuation ignored, `stop` in any case."""
    normal = unicodedata.normalize("NFKC", text).strip()
    while normal and (normal[-1].isspace() or unicodedata.category(normal[-1]).startswith("P")):
        normal = normal[:-1]
    return normal.casefold() in WORDS


class Stopped(Exception):
    """The turn was stopped by the owner's stop word (raised out of `Stops.running`)."""


class Ticket:
    """One message (or scheduled prompt) of a user being handled: stopped yet, and the task of its turn."""
    __slots__ = ("user_id", "inbound_id", "stopped", "task", "cancelled")

    def __init__(self, user_id: str):
        self.user_id = user_id
        self.inbound_id: int | None = None      # once recorded in the inbound table
        self.stopped = False                    # a stop word came: nothing more of it runs
        self.task: asyncio.Task | None = None   # while its turn runs
        self.cancelled = False                  # the stop cancelled that task


class Stops:
    """The tickets of the messages being handled, per user, and the stop word's handling."""

    def __init__(self, approvals: Approvals, gate: Gate, outbox: Outbox, monitor=None):
        self.approvals = approvals
        self.gate = gate
        self.outbox = outbox
        self.store = outbox.store
        self.monitor = monitor
        self._tickets: dict[str, set[Ticket]] = {}      # a user is forgotten once none of theirs is handled

    def enter(self, user_id: str) -> Ticket:
        """A ticket for a message of `user_id` about to be handled (taken before its first await)."""
        ticket = Ticket(user_id)
        self._tickets.setdefault(user_id, set()).add(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Its turn is over (a stop no longer concerns it); idempotent."""
        tickets = self._tickets.get(ticket.user_id)
        if tickets is not None:
            tickets.discard(ticket)
            if not tickets:
                del self._tickets[ticket.user_id]

    @contextmanager
    def running(self, ticket: Ticket) -> Iterator[None]:
        """The scope of a turn: a stop cancels it, and that cancellation leaves as `Stopped`; a shutdown's
        cancellation (also one on top of a stop) leaves as a cancellation."""
        task = ticket.task = asyncio.current_task()
        try:
            yield
        except BaseException:
            if ticket.cancelled and task.uncancel() == 0:
                raise Stopped() from None
            raise
        finally:
            ticket.task = None
        if ticket.cancelled:            # it swallowed the cancellation and ended anyway: still stopped
            task.uncancel()
            raise Stopped()

    async def stop(self, message: Inbound, channel: Channel) -> bool:
        """Handle a stop word: cancel, reject, drop, audit, queue STOPPED in the outbox. Whether STOPPED was
        queued: if not (the database is lost), the caller answers on the channel directly."""
        user_id = message.user_id
        skills = self.gate.calls.get(user_id, 0)
        turns, queued = self._cancel(user_id)
        self.outbox.stopped(user_id)    # what waits goes out after STOPPED, not after the answers it ended
        up = self.monitor is None or self.monitor.available
        rejected = up and await self._tried(self.approvals.reject(user_id, "stop"), "reject the pending approval")
        for ticket in queued:
            if up and ticket.inbound_id is not None:
                await self._tried(self.store.finish_inbound(ticket.inbound_id), "mark a dropped message handled")
        detail = f"turns={turns} skills={skills} approvals={int(bool(rejected))} queued={len(queued)}"
        log.info("stop from %s on %s: %s", user_id, message.channel, detail)
        answered = up and await self._tried(self.store.audit(AuditEntry("stop", user_id=user_id, detail=detail)),
                                            "audit the stop")
        return answered and await self._tried(self.outbox.send(user_id, STOPPED, channel.name,
                                                               inbound_id=message.inbound_id), "queue the answer")

    def _cancel(self, user_id: str) -> tuple[int, list[Ticket]]:
        """Mark every ticket of `user_id` stopped and cancel the turns running; how many turns, and the rest."""
        turns, queued = 0, []
        for ticket in self._tickets.get(user_id, ()):
            ticket.stopped = True
            if ticket.task is not None and not ticket.cancelled:
                ticket.cancelled = True
                ticket.task.cancel()
                turns += 1
            elif ticket.task is None:
                queued.append(ticket)
        return turns, queued

    async def _tried(self, step, what: str) -> bool:
        """Await `step`; False (logged) if the database refused it."""
        try:
            result = await step
        except StoreError as exc:
            log.error("stop: could not %s: %s", what, exc)
            if self.monitor is not None:
                self.monitor.suspect()
            return False
        return result is not False

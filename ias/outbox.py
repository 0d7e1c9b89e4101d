"""The outbox: every message to the owner is written to PostgreSQL first, then delivered.

A message is split into parts (the channel's `text_max`; at most OUTBOX_PARTS_MAX, the rest cut with
a note), each a row with the `client_id` it is always sent with, so a part is never sent twice
across restarts. Replies first: once the owner writes, what waits is held (OUTBOX_ANSWER_HOLD at
most) until the answer to their message is queued; that answer (and, on `继续`, what is left of it)
goes out first, then the rest oldest first, within what the channel can take now (`Channel.room`:
WeChat's window and per-message budget; the note rule is `channels.base.budget`, which direct sends share):
- budget spent: the last allowed message is the channel's note ("reply to continue") while the
  answer is not out, else the summary `还有 N 条消息待发送，回复「继续」查看`; a backlog that does not
  fit behind an answer is not started, only summarised; the rest waits and goes out when the owner
  writes (a bare `继续` then only continues);
- window shut or `ret=-2`: waits until the owner writes;
- a transient error: retried with backoff (OUTBOX_RETRY_FIRST, doubled, at most OUTBOX_RETRY_MAX);
- a reminder or task result still queued `fallback_after` past its due time goes to the
  fallback notifiers (state `fallback`, never sent on WeChat afterwards);
- queued longer than `expire`: expired, and the owner is told how many the next time a
  message goes through.
Task runs record delivery (`delivered|queued|fallback|expired`) from their parts.

Files a turn's skills returned (ias/outgoing.py) are queued with its reply, after the text: each file's
caption as a text part, then the file as a part of its own (`file_path`: its private copy), sent with the
channel's `send_file` under its client_id and counted as one message, like a text part, in every rule
above except the fallback (a file waits for the channel, or expires). Only a copy `outgoing.own` accepts
is sent (a stored path is hostile too); copies no queued part names are removed by `tick` once
OUTGOING_KEEP old (sent, expired, or left by a failed turn).

Confirmation codes never enter the table: `urgent()` sends a code message at once, or holds
it in memory until the owner writes (the fallback notifiers get a notice without the code).
The window keeper (`tick`) spends one message per window asking the owner to write when a
task is due after the window would close.

A send and its mark are not split by a stop: the request and its record run in a task the supervisor
shields (its RECORDS group, which the daemon's stop waits for); a cancelled caller waits for it
(OUTBOX_SEND_GRACE at most).
Before each request the part is marked "in doubt" until OUTBOX_UNKNOWN_WAIT from now, and a
request that got no answer in time (`UNKNOWN`: the service may still complete it) stays so: it is
not sent again before that wait is over, then once more under the same client_id (the parts behind
it go on meanwhile). Chosen over "never again", which would lose a part the service never took;
a kill -9 or a stop past the grace mid-send likewise waits, then repeats the part once under its
client_id. What was queued for the console (a terminal session that is gone) is dropped at start.
Not handled: one message over several channels (each row has one channel).
"""
from __future__ import annotations

import asyncio
import logging
import time
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import groupby
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from . import limits, outgoing
from .channels.base import FAILED, SENT, SHUT, UNKNOWN, Channel, budget, capped, split_text
from .clock import SYSTEM
from .errors import StoreError
from .notifiers import Fallback
from .scheduler import keeper_ask
from .store import OutboxRow, Store
from .supervisor import Supervisor

log = logging.getLogger(__name__)

CONTINUE_WORDS = frozenset({"继续", "繼續", "continue", "go on"})
APPROVAL_NOTICE = "有操作等待确认：{name}。请在微信里回复任意内容查看确认码（{minutes} 分钟内有效）"
EXPIRED_NOTICE = "有 {count} 条消息等待超过 {span}仍未能送达，已过期。"
TITLES = {"reminder": "iAs 提醒", "task": "iAs 定时任务", "notice": "iAs 通知", "reply": "iAs 回复"}
FALLBACK_KINDS = ("reminder", "task")
BACKLOG_NOTE = "还有 {count} 条消息待发送，回复「继续」查看"
IN_DOUBT = "in doubt: sent without an answer"       # the reason of a part whose request may have landed
FILE_TEXT = "[文件] {name}"                           # a file part's text: what `ias outbox` shows of it


def retry_delay(attempts: int) -> float:
    """Seconds before the next try of a part (or a fallback) that failed `attempts` times before."""
    return min(limits.OUTBOX_RETRY_MAX, limits.OUTBOX_RETRY_FIRST * 2 ** min(attempts, 16))


def span(seconds: float) -> str:
    """A duration for the owner: 3 天, 5 小时, 10 分钟."""
    for unit, name in ((86400, "天"), (3600, "小时"), (60, "分钟")):
        if seconds >= unit:
            return f"{seconds / unit:g} {name}"
    return f"{seconds:g} 秒"


@dataclass(slots=True)
class _Held:
    """A confirmation message that could not go out yet: in memory only, never stored."""
    channel: str
    text: str
    until: float                    # monotonic: past it the approval has ended anyway
    delivered: asyncio.Event


class Outbox:
    """Queues, delivers, retries, expires and falls back; `tick` runs the periodic part."""

    def __init__(self, store: Store, channels: dict[str, Channel], primary: str, fallback: Fallback | None = None, *,
                 now: Callable[[], datetime] = SYSTEM.now, expire: float = limits.OUTBOX_EXPIRE,
                 fallback_after: float = limits.FALLBACK_AFTER,
                 tick: float = limits.OUTBOX_TICK, on_store_error: Callable[[StoreError], Awaitable[None]] | None = None,
                 monotonic: Callable[[], float] = SYSTEM.monotonic, supervisor: Supervisor | None = None,
                 outgoing: Path | None = None, wall: Callable[[], float] = time.time):
        self.store = store
        self.outgoing = outgoing        # where the files to send are (None: no file is ever sent)
        self.wall = wall                # against the copies' mtimes
        self.supervisor = supervisor or Supervisor()     # None: one of its own (tests)
        self.channels = channels
        self.primary = primary
        self.fallback = fallback or Fallback([])
        self.now = now
        self.expire = expire
        self.fallback_after = fallback_after
        self.interval = tick
        self.on_store_error = on_store_error
        self._locks: dict[str, asyncio.Lock] = {}
        self._held: dict[str, _Held] = {}
        self.monotonic = monotonic
        self._awaiting: dict[str, tuple[int, float]] = {}   # user -> (answers awaited, held until: monotonic)
        self._answer: dict[str, set[int]] = {}      # user -> the parts of the answer to their latest message
        self._unsettled: dict[int, datetime] = {}   # parts sent whose "sent" the database refused -> when sent
        self.keeper_asks = 0

    # -- queueing and delivering ------------------------------------------------------------
    async def send(self, user_id: str, text: str, channel: str | None = None, kind: str = "reply", *,
                   due: datetime | None = None, run_id: int | None = None, inbound_id: int | None = None,
                   files: Sequence[outgoing.OutFile] = ()) -> str:
        """Queue `text` for the owner, then deliver what can go now: 'delivered', 'queued' or 'empty'.
        A 'reply' is the answer to the owner's latest message: it goes before everything that waits.
        `inbound_id`: the message it answers, marked handled in the same transaction as the queueing.
        `files`: sent after the text, each after its caption (see the module docstring)."""
        name = channel or self.primary
        target = self.channels.get(name)
        limit = target.text_max if target is not None else None
        parts: list[tuple[str, ...]] = [(part,) for part in capped(split_text(text, limit))]
        for item in files[:limits.OUTBOX_PARTS_MAX]:
            parts += [(part,) for part in split_text(item.caption or "", limit)]
            parts.append((FILE_TEXT.format(name=item.name), item.path))
        if len(files) > limits.OUTBOX_PARTS_MAX:
            log.warning("outbox: %d files for %s were not queued (at most %d a message)",
                        len(files) - limits.OUTBOX_PARTS_MAX, user_id, limits.OUTBOX_PARTS_MAX)
        if not parts:
            return "empty"
        now = self.now()
        message = f"ias-{uuid.uuid4().hex}"
        rows = await self.store.enqueue(user_id, name, kind, [(part[0], f"{message}.{i}", *part[1:]) for i, part in
                                                               enumerate(parts, 1)], now, due or now, run_id,
                                       inbound_id)
        try:
            sent = await self.flush(user_id, rows if kind == "reply" else None)
        except StoreError as exc:       # queued for good: never queued twice by a caller that tries again
            log.warning("outbox: %d parts for %s are queued; their delivery waits for the database: %s",
                        len(rows), user_id, exc)
            return "queued"
        return "delivered" if all(row.id in sent for row in rows) else "queued"

    def _lock(self, user_id: str) -> asyncio.Lock:
        return self._locks.setdefault(user_id, asyncio.Lock())

    async def flush(self, user_id: str, answer: list[OutboxRow] | None = None) -> set[int]:
        """Deliver the user's queued parts within what each channel takes now: the answer to their latest
        message first (`answer`, when it was just queued), then the rest oldest first; the ids sent.
        While the owner waits for an answer (they wrote; OUTBOX_ANSWER_HOLD at most), only answers go."""
        sent: set[int] = set()
        async with self._lock(user_id):
            await self._settle_sent()
            awaited, until = self._awaiting.pop(user_id, (0, 0.0))
            if answer is not None:
                awaited -= 1
                self._answer[user_id] = {row.id for row in answer}
            if awaited > 0 and until > self.monotonic():
                self._awaiting[user_id] = (awaited, until)
            else:
                awaited = 0
            first = self._answer.get(user_id, set())
            rows = await self.store.queued(user_id)
            if awaited:
                rows = [row for row in rows if row.id in first]     # another answer is still to come
            order = sorted(rows, key=lambda r: (r.channel, r.id not in first, r.id))
            for name, group in groupby(order, key=lambda r: r.channel):
                await self._flush_channel(user_id, name, list(group), sent, first)
        return sent

    async def _flush_channel(self, user_id: str, name: str, rows: list[OutboxRow], sent: set[int],
                             first: set[int]) -> None:
        channel = self.channels.get(name)
        if channel is None:
            await self.store.note_waiting([r.id for r in rows], f"channel {name} not running")
            return
        now = self.now()
        rows = [r for r in rows if not (r.reason == IN_DOUBT and r.next_try_at is not None and r.next_try_at > now)]
        if not rows:
            return                              # what may have landed waits for its second try
        if self.fallback and not channel.can_confirm():
            rows = await self._unread(rows)     # nobody reads this channel (a console without a terminal)
            if not rows:
                return
        room, why = await channel.room(user_id)
        if room is None or room > 0:
            rows = rows + await self._expired_notice(user_id, name, now)
        answered = False
        for i, row in enumerate(rows):
            rest = [r.id for r in rows[i:]]
            if row.next_try_at is not None and row.next_try_at > now:
                return                          # it waits for its retry; the rest keep their order
            go, note = budget(len(rest), room, channel.budget_note)
            if not go and not note:
                await self.store.note_waiting(rest, why or "budget")
                return
            backlog = row.id not in first
            if note and (not go or backlog and answered):
                # the answer not out yet: "reply to continue"; else the backlog in one line
                text = BACKLOG_NOTE.format(count=len(rest)) if backlog else channel.budget_note
                outcome = await channel.post(user_id, text, f"ias-{uuid.uuid4().hex}")
                await self.store.note_waiting(rest, "budget" if outcome in (SENT, UNKNOWN) else "window")
                log.info("outbox: %d parts for %s wait for their reply (send budget)", len(rest), user_id)
                return
            outcome = await self._deliver(channel, row)
            if outcome in (SENT, UNKNOWN):
                if outcome == SENT:
                    sent.add(row.id)
                answered = answered or row.id in first
                room = None if room is None else room - 1
            else:
                await self.store.note_waiting(rest[1:], "window" if outcome == SHUT else "behind a failed part")
                return

    async def _deliver(self, channel: Channel, row: OutboxRow) -> str:
        """Send one part and record the outcome, shielded by the supervisor so that a stop does not split
        them: a cancelled caller waits for it (OUTBOX_SEND_GRACE at most) before it ends; one still being
        sent then is in doubt (tried again after OUTBOX_UNKNOWN_WAIT) unless it ends before the stop does."""
        return await self.supervisor.shield(self._post(channel, row), f"outbox part {row.client_id}",
                                            grace=limits.OUTBOX_SEND_GRACE)

    async def _post(self, channel: Channel, row: OutboxRow) -> str:
        """The request for one part, marked in doubt first (until OUTBOX_UNKNOWN_WAIT from now: a process
        that dies before the answer is recorded does not send it again sooner), then its outcome."""
        now = self.now()
        if row.file_path is not None and (self.outgoing is None or not outgoing.own(row.file_path, self.outgoing)):
            log.error("outbox: part %s names a file that is no copy of ours (%r): not sent", row.client_id,
                      row.file_path)
            await self.store.settle([row.id], "expired", now, "file refused")
            return FAILED
        await self.store.note_failure(row.id, IN_DOUBT, now + timedelta(seconds=limits.OUTBOX_UNKNOWN_WAIT))
        if row.file_path is None:
            outcome = await channel.post(row.user_id, row.text, row.client_id)
        else:
            outcome = await channel.send_file(row.user_id, Path(row.file_path), None, row.client_id)
        if outcome == SENT:
            self._unsettled[row.id] = self.now()
            await self._settle_sent()
        elif outcome == SHUT:
            await self.store.note_retry(row.id, "window", None)
        elif outcome == UNKNOWN:
            log.warning("outbox: part %s got no answer; not sent again before %gs have passed", row.client_id,
                        limits.OUTBOX_UNKNOWN_WAIT)
        else:
            await self.store.note_retry(row.id, "send failed", now + timedelta(seconds=retry_delay(row.attempts)))
        return outcome

    async def _settle_sent(self) -> None:
        """Record the parts sent as sent; one the database refuses stays noted here (never sent again: it
        is in doubt in the table meanwhile) and is recorded by the next flush or tick. Two users' flushes may
        settle the same part at once (settling is idempotent): the second finds it gone from the notes."""
        for row_id, when in list(self._unsettled.items()):
            await self.store.settle([row_id], "sent", when)
            self._unsettled.pop(row_id, None)

    async def _unread(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """Reminders and task results for a channel nobody reads go to the fallback at once (and are still
        written there, for the log); returns the rows left for the channel alone."""
        left = []
        for row in rows:
            if row.kind in FALLBACK_KINDS and row.file_path is None \
                    and await self.fallback.send(TITLES[row.kind], row.text, row.kind):
                await self.store.settle([row.id], "fallback", self.now(), "fallback")
                await self.channels[row.channel].post(row.user_id, row.text, row.client_id)
            else:
                left.append(row)
        return left

    async def _expired_notice(self, user_id: str, channel: str, now: datetime) -> list[OutboxRow]:
        count = await self.store.take_expired_notice(user_id)
        if not count:
            return []
        text = EXPIRED_NOTICE.format(count=count, span=span(self.expire))
        return await self.store.enqueue(user_id, channel, "notice", [(text, f"ias-{uuid.uuid4().hex}.1")], now, now)

    async def forget_unresumable(self) -> int:
        """At start: what a past process queued for a channel that is not resumable (the console: that
        terminal session is gone, and a part it printed just before dying would print again) is dropped."""
        names = [name for name, channel in self.channels.items() if not channel.resumable]
        dropped = await self.store.drop_queued(names, self.now()) if names else []
        if dropped:
            log.info("outbox: dropped %d parts queued for %s by a previous process", len(dropped), ", ".join(names))
        return len(dropped)

    # -- the owner writes ---------------------------------------------------------------------
    async def inbound(self, user_id: str, channel: str, text: str) -> bool:
        """The owner wrote: release a held confirmation message, then what waits. True when the message
        did nothing else (it released a code, or was a bare `继续` to continue a long reply)."""
        consumed = False
        held = self._held.get(user_id)
        if held is not None and held.channel == channel:
            if self.monotonic() >= held.until:
                self._held.pop(user_id, None)
            elif await self.channels[channel].post(user_id, held.text, f"ias-{uuid.uuid4().hex}") == SENT:
                self._held.pop(user_id, None)
                held.delivered.set()
                log.info("outbox: the held confirmation message went out to %s", user_id)
                consumed = True
        waiting = any(row.reason == "budget" for row in await self.store.queued(user_id))
        word = unicodedata.normalize("NFKC", text).strip().lower().rstrip("。.!！")
        if consumed or (waiting and word in CONTINUE_WORDS):
            await self.flush(user_id)
            return True
        awaited, _ = self._awaiting.get(user_id, (0, 0.0))      # its answer goes first
        self._awaiting[user_id] = (awaited + 1, self.monotonic() + limits.OUTBOX_ANSWER_HOLD)
        return False

    def stopped(self, user_id: str) -> None:
        """The stop word came: the answers awaited for the user's earlier messages will not come, only its own."""
        self._awaiting[user_id] = (1, self.monotonic() + limits.OUTBOX_ANSWER_HOLD)

    # -- confirmation messages ---------------------------------------------------------------------
    async def urgent(self, user_id: str, channel: str, text: str, name: str, timeout: float) -> bool | asyncio.Event:
        """A confirmation message (it holds a code, so it is never stored): True once sent; when the channel
        cannot carry it now but will when the owner writes, an Event set once it went out (the fallback
        notifiers get a notice without the code); False when it cannot be delivered at all."""
        target = self.channels[channel]
        room, _ = await target.room(user_id)
        outcome = None
        if room is None or room > 0:
            outcome = await target.post(user_id, text, f"ias-{uuid.uuid4().hex}")
            if outcome == SENT:
                return True
        if room is None and outcome != SHUT:
            return False                    # a channel without a window: writing will not change anything
        held = _Held(channel, text, self.monotonic() + timeout, asyncio.Event())
        self._held[user_id] = held
        minutes = max(1, round(timeout / 60))
        if self.fallback:
            notice = APPROVAL_NOTICE.format(name=name, minutes=minutes)
            if not await self.fallback.send(TITLES["notice"], notice, "notice"):
                log.warning("outbox: no fallback took the notice of a pending confirmation (%s)",
                            self.fallback.last_error)
        log.info("outbox: a confirmation message for %s waits for them to write (%s)", user_id, name)
        return held.delivered

    # -- periodic work: retries, fallback, expiry, window keeper ---------------------------------
    async def tick(self) -> None:
        now = self.now()
        await self._settle_sent()
        for user_id, held in list(self._held.items()):
            if self.monotonic() >= held.until:
                del self._held[user_id]
        expired = await self.store.expire_queued(now - timedelta(seconds=self.expire), now)
        if expired:
            log.warning("outbox: %d queued parts expired after %s", len(expired), span(self.expire))
        queued = waiting = await self.store.queued()
        if self.fallback:
            queued = await self._fall_back(queued, now)
        for user_id in sorted({row.user_id for row in queued}):
            await self.flush(user_id)
        await self._keep_windows(now)
        await self._sweep(waiting)

    async def _sweep(self, queued: list[OutboxRow]) -> None:
        """Remove the file copies no part `queued` (this tick's) names, once OUTGOING_KEEP old; a part sent
        since still protects its copy until the next tick."""
        if self.outgoing is None:
            return
        named = {row.file_path for row in queued if row.file_path is not None}
        removed = await asyncio.to_thread(outgoing.sweep, self.outgoing, named, self.wall(), limits.OUTGOING_KEEP)
        if removed:
            log.info("outbox: removed %d file copies that are sent, expired or were never queued", removed)

    async def _fall_back(self, queued: list[OutboxRow], now: datetime) -> list[OutboxRow]:
        """Hand overdue reminders and task results to the fallback notifiers; returns what stays queued."""
        deadline = now - timedelta(seconds=self.fallback_after)
        overdue: dict[str, list[OutboxRow]] = {}
        for row in queued:
            if row.kind in FALLBACK_KINDS and row.file_path is None and row.due_at <= deadline \
                    and (row.next_try_at is None or row.next_try_at <= now):
                overdue.setdefault(row.client_id.rsplit(".", 1)[0], []).append(row)
        done: set[int] = set()
        for parts in overdue.values():
            ids = [row.id for row in parts]
            text = "\n".join(row.text for row in parts)
            if await self.fallback.send(TITLES[parts[0].kind], text, parts[0].kind):
                await self.store.settle(ids, "fallback", self.now(), "fallback")
                done.update(ids)
                continue
            delay = retry_delay(max(row.attempts for row in parts))
            reason = f"fallback failed: {self.fallback.last_error}"[:500]
            for row_id in ids:
                await self.store.note_failure(row_id, reason, now + timedelta(seconds=delay))
            log.warning("outbox: the fallback did not take an overdue %s; retrying in %gs", parts[0].kind, delay)
        return [row for row in queued if row.id not in done]

    async def _keep_windows(self, now: datetime) -> None:
        """Ask the owner to write, once per window, when a task is due after their window would close."""
        channel = self.channels.get(self.primary)
        if channel is None:
            return
        tasks = [t for t in await self.store.tasks(include_disabled=False) if t.next_run_at is not None]
        for user_id, theirs in groupby(sorted(tasks, key=lambda t: (t.user_id, t.next_run_at)), key=lambda t: t.user_id):
            window = await channel.window(user_id)
            stamp = now.timestamp()
            if window is None or window.opened is None or window.asked or stamp >= window.closes or window.left <= 0:
                continue
            quiet = stamp >= window.closes - limits.KEEPER_LEAD
            last = window.left <= 1
            if not (quiet or last):
                continue
            low = now if last else datetime.fromtimestamp(window.closes, timezone.utc)
            high = now + timedelta(seconds=window.length)
            due = [t for t in theirs if low < t.next_run_at <= high]
            if not due:
                continue
            first = due[0]
            text = keeper_ask(first, now)
            await channel.mark_asked(user_id)
            self.keeper_asks += 1
            log.info("window keeper: asked %s to write (task %d due %s)", user_id, first.id,
                     first.next_run_at.isoformat())
            await self.send(user_id, text, self.primary, "notice")

    async def run(self) -> None:
        """Forever: flush what waits at start, then tick every `interval` seconds."""
        while True:
            try:
                await self.tick()
            except StoreError as exc:
                if self.on_store_error is None:
                    raise
                await self.on_store_error(exc)
                continue
            await asyncio.sleep(self.interval)

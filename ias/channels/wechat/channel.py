"""The WeChat channel: polling `getupdates`, sending with `sendmessage`, the send budget and the 24 h window.

The iLink HTTP client, the protocol constants and the `channel_state` keys live in `ilink.py`
(protocol facts in reference/wechat-ilink.md); the QR login that yields the token lives in
`login.py` (both beside this module). Only the owner (the person who scanned the QR code) is served. Inbound
messages are recorded in the store (`inbound`, their ids in `seen_messages`) before the cursor moves
past them, so a redelivery is handled once and a restart mid-turn loses nothing (the router replays
what is pending). While the database is lost a message is passed on unrecorded (the router holds it)
and the batch is fetched again.
The cursor, the latest `context_token` and the time of the last inbound message are persisted
in `channel_state`, because sends are only accepted within 24 h of the user's last message
and must echo that token.

`stop()` cancels a held 35-second long poll at once: the client opens one connection per request.
The long poll, the media notes and the deliveries to the router run under the supervisor the channel
is given (its CHANNELS group): a crash of the long poll is a crash of the daemon.

Media (`media.py`, the CDN in `cdn.py`): images, files, videos and voice without a transcript are
downloaded into the owner's inbox before the message is recorded (a redelivery's copies are removed
again) and reach the router as the Inbound's attachments; what failed is told to the owner in one line.
`send_file` uploads a file and sends it as one image or file item (its caption first, as text). A channel
built without `media` answers media with a short note instead.

Deliberately not handled: typing indicators (`getconfig`/`sendtyping`), `msg/notifystart|stop`, group
chats, several bots.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from ... import limits
from ...errors import IasError, StoreError
from ...supervisor import CHANNELS, Supervisor
from .ilink import (BOT_MESSAGE, CHANNEL, CURSOR, FINISHED, GET_UPDATES, PEER, SEND_MESSAGE, STALE, STALE_MARK, TEXT,
                     USER_MESSAGE, Credentials, ILink, WeChatError, error_code)
from .media import Media, parse
from ..base import FAILED, SENT, SHUT, UNKNOWN, Channel, Deliver, Inbound, Window

log = logging.getLogger(__name__)

OUT_OF_WINDOW = -2          # sendmessage: outside the window, over the allowance, or rate limited

MEDIA_ONLY = "暂时只能处理文字和语音消息。"
MEDIA_MIXED = "暂时只能处理文字和语音消息，附带的图片、文件或视频已忽略。"
BUDGET_NOTE = "本轮消息较多，已暂停发送。请回复任意内容以继续。"
STALE_NOTE = ("微信登录已失效（iLink -14），iAs 已停止接收微信消息。请在服务器上运行 "
              "`python ias.py wechat login` 重新登录，然后重启 iAs。\n"
              "WeChat session expired (iLink -14): polling stopped. Run `python ias.py wechat login`, "
              "then restart iAs.")


@dataclass(slots=True)
class _Peer:
    """What the channel tracks per user; all but the locks is persisted under `peer:<id>`."""
    context_token: str | None = None
    last_inbound: float | None = None       # epoch seconds
    sent: int = 0                           # bot messages since the user's last message
    learned: float | None = None            # a shorter window learned from a ret=-2 inside the configured one
    asked: float | None = None              # the last_inbound of the window in which the keeper asked
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)
    saving: asyncio.Lock = field(default_factory=asyncio.Lock)


class WeChatChannel(Channel):
    """The owner's personal WeChat, through the bot they bound with `ias wechat login`.

    The send budget: at most WECHAT_SEND_BUDGET bot messages per owner message (`room`); when more
    waits than fits, the last is BUDGET_NOTE ("reply to continue", the rule `base.budget`), so the
    owner learns why output stopped.
    """

    name = CHANNEL
    text_max = limits.WECHAT_TEXT_MAX
    budget_note = BUDGET_NOTE
    resumable = True

    def __init__(self, store, credentials: Credentials, *, now: Callable[[], float] = time.time,
                 on_stale: Callable[[str], Awaitable[None]] | None = None,
                 retry_delay: float = limits.WECHAT_RETRY_DELAY, backoff_delay: float = limits.WECHAT_BACKOFF_DELAY,
                 window: float = limits.WECHAT_REPLY_WINDOW, budget: int = limits.WECHAT_SEND_BUDGET,
                 send_timeout: float = limits.WECHAT_SEND_TIMEOUT, supervisor: Supervisor | None = None,
                 media: Media | None = None):
        self.store = store
        self.media = media                  # None: media is answered with a note, not downloaded
        self.supervisor = supervisor or Supervisor()     # None: one of its own (tests)
        self._notes = self.supervisor.scope("wechat notes")     # our own sends (media notes): cancelled on stop
        self.credentials = credentials
        self.owner = credentials.owner
        self.stale = False
        self._api = ILink(credentials.base_url, credentials.token)
        self._now = now
        self._on_stale = on_stale
        self._retry_delay = retry_delay
        self._backoff_delay = backoff_delay
        self.span = window                  # the configured window length, seconds
        self.budget = budget
        self.send_timeout = send_timeout
        self._deliver: Deliver | None = None
        self._peers: dict[str, _Peer] = {}
        self._poller: asyncio.Task | None = None
        self._first_poll = asyncio.Event()              # the first getupdates has returned (or failed)

    async def start(self, deliver: Deliver) -> None:
        if self._poller is not None:
            return
        self._deliver = deliver
        self._poller = self.supervisor.spawn(self._poll(), "wechat poll", group=CHANNELS)

    async def caught_up(self, timeout: float) -> None:
        """Wait at most `timeout` s for the first long poll to return: what was already waiting on the
        server (the owner's latest message, which opens the window) is then known before sending."""
        try:
            await asyncio.wait_for(self._first_poll.wait(), timeout)
        except TimeoutError:
            pass                                # nothing was waiting: the server holds the poll

    @property
    def polling(self) -> bool:
        """Whether the long poll runs (not before start, after stop, or once the session is stale)."""
        return self._poller is not None and not self._poller.done()

    async def stop(self) -> None:
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
            await asyncio.wait([self._poller], timeout=limits.WECHAT_STOP_GRACE)
        await self._notes.cancel(limits.WECHAT_STOP_GRACE)

    # -- receiving ------------------------------------------------------------------------
    async def _poll(self) -> None:
        cursor: str | None = None           # read inside the loop, so a database hiccup is retried too
        marked = False
        hold = limits.WECHAT_POLL_TIMEOUT
        failures = 0
        log.info("WeChat: polling %s as bot %s for owner %s", self._api.base_url, self.credentials.bot_id, self.owner)
        while True:
            try:
                if cursor is None:
                    cursor = await self.store.get_state(CHANNEL, CURSOR) or ""
                    marked = await self.store.get_state(CHANNEL, STALE_MARK) is not None
                reply = await self._api.call(GET_UPDATES, {"get_updates_buf": cursor},
                                             hold + limits.WECHAT_POLL_MARGIN)
                code = error_code(reply)
                if code == STALE:
                    await self._expire(reply.get("errmsg"))
                    return
                if code:
                    raise WeChatError(f"ret {code} {reply.get('errmsg') or ''}".strip())
                messages = reply.get("msgs")
                for message in messages if isinstance(messages, list) else []:
                    await self._receive(message)
                after = reply.get("get_updates_buf")
                if isinstance(after, str) and after and after != cursor:
                    await self.store.set_state(CHANNEL, CURSOR, after)
                    cursor = after
                if marked:
                    await self.store.set_state(CHANNEL, STALE_MARK, None)
                    marked = False
                self._first_poll.set()
            except TimeoutError:
                self._first_poll.set()
                continue                        # held longer than announced: an empty result
            except (OSError, IasError) as exc:
                self._first_poll.set()
                failures += 1
                if failures >= limits.WECHAT_FAILURES_BEFORE_BACKOFF:
                    log.warning("WeChat: getupdates failed %d times in a row (%s); pausing %gs",
                                failures, exc, self._backoff_delay)
                    failures = 0
                    await asyncio.sleep(self._backoff_delay)
                else:
                    log.warning("WeChat: getupdates failed (%s); retrying in %gs", exc, self._retry_delay)
                    await asyncio.sleep(self._retry_delay)
                continue
            failures = 0
            announced = reply.get("longpolling_timeout_ms")
            if isinstance(announced, (int, float)) and announced > 0:
                hold = min(max(announced / 1000, limits.WECHAT_POLL_TIMEOUT_MIN), limits.WECHAT_POLL_TIMEOUT_MAX)

    async def _receive(self, message: Any) -> None:
        """Handle one message; a store failure propagates so the batch is fetched again."""
        try:
            await self._handle(message)
        except IasError:
            raise
        except Exception:       # one malformed message must not stop the channel
            log.exception("WeChat: a message could not be handled")

    async def _handle(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("message_type") != USER_MESSAGE:
            return
        sender = message.get("from_user_id")
        if sender != self.owner:
            log.info("WeChat: ignored a message from %s (not the owner)", sender)
            return
        raw_id = message.get("message_id")
        message_id = None if raw_id in (None, "") else str(raw_id)
        text, items = parse(message.get("item_list"))
        attachments, notes = (), [MEDIA_MIXED if text else MEDIA_ONLY] if items else []
        if items and self.media is not None:
            attachments, notes = await self.media.receive(items)
        inbound_id = unrecorded = None
        try:
            if text or attachments:     # recorded, pending until handled; its id marked seen in the same transaction
                inbound_id = await self.store.record_inbound(CHANNEL, sender, message_id, text,
                                                             [a.record() for a in attachments])
                fresh = inbound_id is not None
            else:
                fresh = message_id is None or await self.store.mark_seen(CHANNEL, message_id)
        except StoreError as exc:
            if not (text or attachments) or message_id is None:
                _remove(attachments)
                raise
            # The router holds it until the database is back (and tells the owner once); the error
            # still ends the batch, so the cursor stays and the service gives it again.
            unrecorded, fresh = exc, True
        if not fresh:
            log.info("WeChat: message %s was already handled", message_id)
            _remove(attachments)
            return
        peer = await self._peer(sender)
        token = message.get("context_token")
        if isinstance(token, str) and token:
            peer.context_token = token
        peer.last_inbound = self._now()
        peer.sent = 0
        try:
            await self._save(sender, peer)
        except IasError as exc:     # already recorded: deliver anyway, the values are kept in memory
            log.error("WeChat: could not store the context of message %s: %s", message_id, exc)
        log.info("WeChat: message %s from the owner (%d characters, %d files)", message_id, len(text),
                 len(attachments))
        for note in notes:
            self._notes.spawn(self._note(sender, note), "wechat media note")
        if (text or attachments) and self._deliver is not None:
            # Not awaited: a turn can take minutes, and an approval reply must get through meanwhile.
            # Tasks start in creation order; the router keeps the turns of one user in order (the router
            # cancels its turns itself).
            self.supervisor.spawn(self._deliver(Inbound(CHANNEL, sender, text, message_id, inbound_id, attachments)),
                                  "wechat delivery", group=CHANNELS)
        if unrecorded is not None:
            raise unrecorded

    async def _note(self, user_id: str, text: str) -> None:
        """A note about media, best effort: the database failing it is logged (the message itself is handled)."""
        try:
            await self.send(user_id, text)
        except IasError as exc:
            log.warning("WeChat: the note to %s about media was not sent: %s", user_id, exc)

    async def _expire(self, detail: Any = None) -> None:
        """-14: stop polling for good (until a new login and restart), say so once."""
        if self.stale:
            return
        self.stale = True
        log.error("WeChat session expired (iLink -14%s): polling stopped; run `ias wechat login` and restart iAs",
                  f": {detail}" if detail else "")
        try:
            await self.store.set_state(CHANNEL, STALE_MARK, {"at": self._now(), "detail": str(detail or "")})
        except IasError as exc:
            log.error("WeChat: could not record the expired session: %s", exc)
        if self._poller is not None and self._poller is not asyncio.current_task():
            self._poller.cancel()
        if self._on_stale is not None:
            try:
                await self._on_stale(STALE_NOTE)
            except Exception:       # the note is best effort; the log line above already says it
                log.exception("WeChat: telling the owner about the expired session failed")

    # -- sending --------------------------------------------------------------------------
    async def _peer(self, user_id: str) -> _Peer:
        peer = self._peers.get(user_id)
        if peer is None:
            stored = await self.store.get_state(CHANNEL, PEER + user_id)
            stored = stored if isinstance(stored, dict) else {}
            peer = self._peers.setdefault(user_id, _Peer(stored.get("context_token"), stored.get("last_inbound"),
                                                         int(stored.get("sent") or 0), stored.get("learned"),
                                                         stored.get("asked")))
        return peer

    async def _save(self, user_id: str, peer: _Peer) -> None:
        async with peer.saving:     # serialised, and each write carries the latest values
            await self.store.set_state(CHANNEL, PEER + user_id, {
                "context_token": peer.context_token, "last_inbound": peer.last_inbound, "sent": peer.sent,
                "learned": peer.learned, "asked": peer.asked})

    def _window(self, peer: _Peer) -> float:
        return min(self.span, peer.learned or self.span)

    async def window(self, user_id: str) -> Window:
        peer = await self._peer(user_id)
        if peer.last_inbound is None:
            return Window(None, None, self.span, 0, False)
        return Window(peer.last_inbound, peer.last_inbound + self._window(peer), self.span,
                      max(0, self.budget - peer.sent), peer.asked == peer.last_inbound)

    async def mark_asked(self, user_id: str) -> None:
        peer = await self._peer(user_id)
        peer.asked = peer.last_inbound
        await self._save(user_id, peer)

    async def room(self, user_id: str) -> tuple[int | None, str | None]:
        if self.stale:
            return 0, "stale"
        peer = await self._peer(user_id)
        if peer.last_inbound is None or self._now() - peer.last_inbound > self._window(peer):
            return 0, "window"
        left = max(0, self.budget - peer.sent)
        return left, "budget" if left == 0 else None

    async def post(self, user_id: str, text: str, client_id: str) -> str:
        """One part for the outbox, with its stable client_id; counts against the budget when sent (or when
        it got no answer in time: UNKNOWN, it may have landed)."""
        if self.stale:
            return SHUT
        peer = await self._peer(user_id)
        async with peer.sending:
            outcome = await self._request(user_id, text, peer, client_id)
            if outcome in (SENT, UNKNOWN):
                peer.sent += 1
            elif outcome == SHUT and not self.stale:
                age = self._now() - (peer.last_inbound or 0)
                if age < limits.WECHAT_WINDOW_LEARN_MIN:
                    return FAILED           # so soon after their message: rate limiting, try again later
                learned = max(limits.WECHAT_WINDOW_LEARN_MIN, age - limits.WECHAT_WINDOW_LEARN_MARGIN)
                if learned < self._window(peer):
                    peer.learned = learned
                    log.warning("WeChat: ret=-2 %.1f h after %s's last message: the window for them is now %.1f h",
                                age / 3600, user_id, learned / 3600)
            await self._save(user_id, peer)
            return outcome

    async def _request(self, user_id: str, text: str, peer: _Peer, client_id: str, item: dict | None = None) -> str:
        """One sendmessage request of `text`, or of one media `item` (`text` then names it in the log): SENT
        (ret 0), SHUT (ret -2 or -14), UNKNOWN (no answer within the send timeout: the service may still
        complete it), FAILED (anything else)."""
        message = {"from_user_id": "", "to_user_id": user_id, "client_id": client_id,
                   "message_type": BOT_MESSAGE, "message_state": FINISHED,
                   "item_list": [item or {"type": TEXT, "text_item": {"text": text}}]}
        if peer.context_token:
            message["context_token"] = peer.context_token
        try:
            reply = await self._api.call(SEND_MESSAGE, {"msg": message}, self.send_timeout)
        except TimeoutError:
            log.warning("WeChat: sendmessage %s to %s got no answer within %gs (it may still land)", client_id,
                        user_id, self.send_timeout)
            return UNKNOWN
        except (OSError, WeChatError) as exc:
            log.warning("WeChat: sendmessage %s to %s failed: %s", client_id, user_id, exc)
            return FAILED
        code = error_code(reply)
        if code == STALE:
            await self._expire(reply.get("errmsg"))
            return SHUT
        if code:
            log.warning("WeChat: sendmessage %s to %s refused: ret %d %s", client_id, user_id, code,
                        reply.get("errmsg") or "")
            return SHUT if code == OUT_OF_WINDOW else FAILED
        log.info("WeChat: sent %s to %s (%s)", client_id, user_id, text if item else f"{len(text)} characters")
        return SENT

    async def send_file(self, user_id: str, path: Path, caption: str | None = None,
                        client_id: str | None = None) -> str:
        """Send the file at `path` as one image or file item, its caption first as a text message: SENT,
        SHUT, FAILED or UNKNOWN as `post`. Each message counts against the budget; the caller checked the
        room (the outbox does). A failed upload is FAILED (retried later), never a logout."""
        if self.stale:
            return SHUT
        if self.media is None:
            log.warning("WeChat: cannot send %s: this channel was built without media", path.name)
            return FAILED
        client_id = client_id or f"ias-{uuid.uuid4().hex}"
        peer = await self._peer(user_id)
        async with peer.sending:
            try:
                item = await self.media.upload(self._api, user_id, peer.context_token, path)
            except (OSError, IasError) as exc:
                log.warning("WeChat: the file %s for %s was not uploaded: %s", path.name, user_id, exc)
                return FAILED
            parts = ([(caption, None, f"{client_id}-caption")] if caption and caption.strip() else []) + \
                [(path.name, item, client_id)]
            for text, media_item, part_id in parts:
                outcome = await self._request(user_id, text, peer, part_id, media_item)
                if outcome in (SENT, UNKNOWN):
                    peer.sent += 1
                if outcome != SENT:
                    break
            await self._save(user_id, peer)
            return outcome


def _remove(attachments) -> None:
    """Remove stored files of a message that is not handled (a redelivery, or not recorded)."""
    for attachment in attachments:
        attachment.path.unlink(missing_ok=True)

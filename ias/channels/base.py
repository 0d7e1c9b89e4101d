"""The one interface every channel implements, and the text and budget rules every sender shares.

What the outbox and the router need from a channel is here, with honest defaults for a channel
that takes everything at once (the console): `room` (how many messages may go now: the one place
that decides), `window` (the send window, None without one), `mark_asked`, `budget_note`, `post`
(one part under a client id), `send` (a direct, unqueued send within the same budget), `can_confirm`.
A subclass implements `start`, `stop` and `post`; a channel with a window or a budget overrides
`room`, `window` and `mark_asked` and sets `budget_note`.

`split_text` and `capped` cut a text into parts for the outbox and for direct sends; `budget` is the
send-budget rule both apply. Not handled: media, several recipients per message, rich text.
"""
from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Awaitable, Callable

from .. import limits
from ..inbox import Attachment

log = logging.getLogger(__name__)

CUT_NOTE = "（内容过长，其余 {count} 字未发送）"


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a user, as the router sees it."""
    channel: str
    user_id: str
    text: str
    message_id: str | None = None
    inbound_id: int | None = None       # its row in the store's `inbound` table, once recorded
    attachments: tuple[Attachment, ...] = ()    # files that came with it, stored in the owner's inbox


@dataclass(frozen=True, slots=True)
class Window:
    """A user's send window now: when it opened (their last message; None: they never wrote) and closes, the
    channel's configured window length, messages left in it, whether the window keeper already asked in it."""
    opened: float | None
    closes: float | None
    length: float
    left: int
    asked: bool


Deliver = Callable[[Inbound], Awaitable[None]]

# What one `post` did: sent; refused until the owner writes (window shut, ret=-2); failed (retry later);
# unknown (no answer in time: it may still land, so not sent again soon).
SENT, SHUT, FAILED, UNKNOWN = "sent", "shut", "failed", "unknown"


def split_text(text: str, limit: int | None = limits.WECHAT_TEXT_MAX) -> list[str]:
    """`text` in parts of at most `limit` characters, cut at a line break in the part's second half when there is one."""
    if not text.strip():
        return []
    if limit is None:
        return [text]
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = rest.rfind("\n", 0, limit + 1)
        if cut < limit // 2:
            cut = limit
        part, rest = rest[:cut], rest[cut:]
        if rest.startswith("\n"):
            rest = rest[1:]
        if part.strip():
            parts.append(part)
    if rest.strip():
        parts.append(rest)
    return parts


def capped(parts: list[str], most: int = limits.OUTBOX_PARTS_MAX) -> list[str]:
    """At most `most` parts: past that, the first `most - 1` and a note saying how much was cut."""
    if len(parts) <= most:
        return parts
    return parts[:most - 1] + [CUT_NOTE.format(count=sum(len(part) for part in parts[most - 1:]))]


def budget(waiting: int, room: int | None, note: str | None) -> tuple[int, bool]:
    """The send-budget rule: of `waiting` messages, how many go now within `room` (None: no limit), and
    whether the channel's `note` ("reply to continue") takes the last place after them: it does when
    they do not all fit and a place is left, so the owner learns why output stopped."""
    if room is None or waiting <= room:
        return waiting, False
    if note is None or room <= 0:
        return max(room, 0), False
    return room - 1, True


class Channel(ABC):
    """A way to reach the owner: `post` one part, `send` a text now; defaults are a channel without a window."""

    name: str = "channel"
    text_max: int | None = None         # characters per message; longer texts are split
    resumable = False                   # whether what was queued for it is still worth sending after a restart
    budget_note: str | None = None      # the last message a spent budget allows ("reply to continue"); None: no budget

    async def room(self, user_id: str) -> tuple[int | None, str | None]:
        """How many messages `user_id` can be sent right now (None: no limit), and why not more."""
        return None, None

    async def window(self, user_id: str) -> Window | None:
        """The user's send window now; None for a channel that can always send (no window to keep open)."""
        return None

    async def mark_asked(self, user_id: str) -> None:
        """The window keeper asked `user_id` to write in their current window: `window().asked` is then True
        until they write. Without a window there is nothing to keep, so nothing to mark."""

    @abstractmethod
    async def post(self, user_id: str, text: str, client_id: str) -> str:
        """Send one part (at most `text_max` characters) under `client_id`: SENT, SHUT, FAILED or UNKNOWN."""

    async def send(self, user_id: str, text: str) -> bool:
        """Send `text` now, unqueued, in parts of `text_max`: True once every part was sent. It goes whole or
        not at all: when it does not fit the room left, with a place kept for whatever comes next, only the
        budget note goes (if there is room for it)."""
        parts = split_text(text, self.text_max)
        if not parts:
            return False
        room, why = await self.room(user_id)
        # Counting what comes after it: not queued, a text that finds no room is lost without the note.
        go, note = budget(len(parts) + (self.budget_note is not None), room, self.budget_note)
        if go < len(parts):
            log.warning("%s: a %d-part text for %s was not sent (%s)%s", self.name, len(parts), user_id,
                        why or "budget", "; asked them to reply to continue" if note else "")
            if note:
                await self.post(user_id, self.budget_note, f"ias-{uuid.uuid4().hex}")
            return False
        for part in parts:
            if await self.post(user_id, part, f"ias-{uuid.uuid4().hex}") != SENT:
                return False
        return True

    @abstractmethod
    async def start(self, deliver: Deliver) -> None:
        """Begin receiving; each inbound message is passed to `deliver`."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop receiving and release resources."""

    def can_confirm(self) -> bool:
        """Whether a confirmation code may be sent here: a person reads it, and it is not a log."""
        return True

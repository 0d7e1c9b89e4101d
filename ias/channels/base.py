"""The one interface every channel implements: start, stop, send, and inbound messages."""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Awaitable, Callable


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a user, as the router sees it."""
    channel: str
    user_id: str
    text: str
    message_id: str | None = None
    inbound_id: int | None = None       # its row in the store's `inbound` table, once recorded


Deliver = Callable[[Inbound], Awaitable[None]]

# What one `post` did: sent; refused until the owner writes (window shut, ret=-2); failed (retry later);
# unknown (no answer in time: it may still land, so not sent again soon).
SENT, SHUT, FAILED, UNKNOWN = "sent", "shut", "failed", "unknown"


class Channel(ABC):
    """A way to reach the owner. `send` returns False when the text could not be delivered."""

    name: str = "channel"
    text_max: int | None = None         # characters per message; longer texts are split by the outbox
    resumable = False                   # whether what was queued for it is still worth sending after a restart

    async def room(self, user_id: str) -> tuple[int | None, str | None]:
        """How many messages `user_id` can be sent right now (None: no limit), and why not more."""
        return None, None

    async def post(self, user_id: str, text: str, client_id: str) -> str:
        """Send one message part under the outbox's `client_id`: SENT, SHUT or FAILED."""
        return SENT if await self.send(user_id, text) else FAILED

    @abstractmethod
    async def start(self, deliver: Deliver) -> None:
        """Begin receiving; each inbound message is passed to `deliver`."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop receiving and release resources."""

    @abstractmethod
    async def send(self, user_id: str, text: str) -> bool:
        """Send `text` to `user_id`; True once delivered (or handed to the transport)."""

    async def watch(self) -> None:
        """Until the channel's own background loop ends: returns when it stopped on purpose, raises
        what crashed it. The daemon runs this under its supervisor. Default: no loop of its own."""
        await asyncio.Event().wait()

    def can_confirm(self) -> bool:
        """Whether a confirmation code may be sent here: a person reads it, and it is not a log."""
        return True

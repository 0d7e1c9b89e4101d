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


Deliver = Callable[[Inbound], Awaitable[None]]


class Channel(ABC):
    """A way to reach the owner. `send` returns False when the text could not be delivered."""

    name: str = "channel"

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

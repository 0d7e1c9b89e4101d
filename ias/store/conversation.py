"""The conversation's SQL: chat history, channel state, seen message ids, inbound messages.

Not handled: what the history sends back to the model (`limits.HISTORY_WINDOW`, the agent).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from psycopg.types.json import Jsonb

from .pool import Pool
from .records import InboundRow
from .values import json_text

_INBOUND_FIELDS = ", ".join(f.name for f in fields(InboundRow))
# An inbound message's outcome is stored (also by the outbox, with the reply that answers it).
FINISH_INBOUND = "UPDATE inbound SET state = 'done', done_at = clock_timestamp() WHERE id = %s AND state = 'pending'"


class Conversation(Pool):
    """The conversation's queries: history, channel state, seen ids, inbound messages."""

    # -- conversation history ---------------------------------------------------------------
    async def append_messages(self, user_id: str, messages: list[dict]) -> None:
        """Append chat messages (OpenAI message dicts) to the user's history, in order, atomically."""
        if not messages:
            return
        async with self._conn() as conn:       # one statement: a turn may answer thousands of refused calls
            await conn.execute("INSERT INTO messages (user_id, message) SELECT %s, m "
                               "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(m, n) ORDER BY n",
                               (user_id, "[" + ",".join(map(json_text, messages)) + "]"))

    async def recent_messages(self, user_id: str, limit: int) -> list[dict]:
        """The user's newest `limit` messages, oldest first."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT message FROM (SELECT id, message FROM messages WHERE user_id = %s ORDER BY id DESC LIMIT %s) m "
                "ORDER BY id", (user_id, limit))
            return [row["message"] for row in await cur.fetchall()]

    async def clear_messages(self, user_id: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("DELETE FROM messages WHERE user_id = %s", (user_id,))
            return cur.rowcount

    # -- channel state --------------------------------------------------------------------
    async def get_state(self, channel: str, key: str) -> Any:
        """A channel's stored JSON value for `key`, or None."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT value FROM channel_state WHERE channel = %s AND key = %s", (channel, key))
            row = await cur.fetchone()
            return None if row is None else row["value"]

    async def set_state(self, channel: str, key: str, value: Any) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO channel_state (channel, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (channel, key) DO UPDATE SET value = EXCLUDED.value, updated_at = clock_timestamp()",
                (channel, key, Jsonb(value)))

    async def clear_state(self, channel: str) -> None:
        """Forget everything a channel stored (logout)."""
        async with self._conn() as conn:
            await conn.execute("DELETE FROM channel_state WHERE channel = %s", (channel,))

    async def mark_seen(self, channel: str, message_id: str) -> bool:
        """Record an inbound message id; False when it was already handled (a redelivery)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "INSERT INTO seen_messages (channel, message_id) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                (channel, message_id))
            return await cur.fetchone() is not None

    # -- inbound messages -------------------------------------------------------------------
    async def record_inbound(self, channel: str, user_id: str, message_id: str | None, text: str,
                             attachments: list[dict] | None = None) -> int | None:
        """Record a message on arrival, pending, with the records of its files (inbox.Attachment.record);
        its row id, or None when its id was seen before (a redelivery: not recorded again)."""
        async with self._tx() as conn:
            if message_id is not None:
                cur = await conn.execute("INSERT INTO seen_messages (channel, message_id) VALUES (%s, %s) "
                                         "ON CONFLICT DO NOTHING RETURNING 1", (channel, message_id))
                if await cur.fetchone() is None:
                    return None
            cur = await conn.execute("INSERT INTO inbound (channel, user_id, message_id, text, attachments) "
                                     "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                                     (channel, user_id, message_id, text, Jsonb(attachments or [])))
            return (await cur.fetchone())["id"]

    async def finish_inbound(self, inbound_id: int) -> None:
        """The message's outcome is stored: it is not handled again."""
        async with self._conn() as conn:
            await conn.execute(FINISH_INBOUND, (inbound_id,))

    async def count_replays(self, ids: list[int]) -> None:
        """These pending messages are being handled again by this start."""
        async with self._conn() as conn:
            await conn.execute("UPDATE inbound SET replays = replays + 1 WHERE id = ANY(%s)", (ids,))

    async def pending_inbound(self) -> list[InboundRow]:
        """Messages recorded but not handled (a restart, a SIGTERM or an outage came first), oldest first."""
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_INBOUND_FIELDS} FROM inbound WHERE state = 'pending' ORDER BY id")
            return [InboundRow(**row) for row in await cur.fetchall()]

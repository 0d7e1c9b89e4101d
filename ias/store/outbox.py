"""The outbox's SQL: queueing a message's parts, settling them, why they wait, and each run's delivery.

Not handled: when and how a part is sent (`ias/outbox.py`, the channels).
"""
from __future__ import annotations

from dataclasses import fields
from datetime import datetime

from .conversation import FINISH_INBOUND
from .pool import Pool
from .records import OutboxRow

_OUTBOX_FIELDS = ", ".join(f.name for f in fields(OutboxRow))
# A run's delivery, from its parts: any fallback, else all sent, else any expired, else queued.
_SETTLE_RUNS = (
    "UPDATE task_runs t SET delivery = d.delivery FROM ("
    "SELECT task_run_id, CASE WHEN bool_or(state = 'fallback') THEN 'fallback' "
    "WHEN bool_and(state = 'sent') THEN 'delivered' WHEN bool_or(state = 'expired') THEN 'expired' "
    "ELSE 'queued' END AS delivery FROM outbox WHERE task_run_id = ANY(%s) GROUP BY task_run_id) d "
    "WHERE t.id = d.task_run_id")


class Outbox(Pool):
    """The outbox's queries: the parts of each message to the owner, and the runs they deliver."""

    async def enqueue(self, user_id: str, channel: str, kind: str, parts: list[tuple[str, ...]], now: datetime,
                      due_at: datetime, task_run_id: int | None = None,
                      inbound_id: int | None = None) -> list[OutboxRow]:
        """Queue the parts of one message ((text, client_id) each, or (text, client_id, file path) for a file,
        in order), and mark its run queued and the inbound message it answers handled."""
        async with self._tx() as conn:
            rows = []
            for text, client_id, *file_path in parts:
                cur = await conn.execute(
                    f"INSERT INTO outbox (user_id, channel, kind, text, client_id, created_at, due_at, task_run_id, "
                    f"file_path) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_OUTBOX_FIELDS}",
                    (user_id, channel, kind, text, client_id, now, due_at, task_run_id, (file_path or [None])[0]))
                rows.append(OutboxRow(**await cur.fetchone()))
            if task_run_id is not None:
                await conn.execute(_SETTLE_RUNS, ([task_run_id],))
            if inbound_id is not None:
                await conn.execute(FINISH_INBOUND, (inbound_id,))
            return rows

    async def queued(self, user_id: str | None = None) -> list[OutboxRow]:
        """Queued parts (of one user, or everyone's), oldest first."""
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_OUTBOX_FIELDS} FROM outbox WHERE state = 'queued' AND (%s::text IS NULL OR user_id = %s) "
                f"ORDER BY id", (user_id, user_id))
            return [OutboxRow(**row) for row in await cur.fetchall()]

    async def outbox_rows(self, include_done: bool = False, limit: int | None = 50) -> list[OutboxRow]:
        """Queued (or all recent) parts, newest first."""
        where = "" if include_done else "WHERE state = 'queued'"
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_OUTBOX_FIELDS} FROM outbox {where} ORDER BY id DESC LIMIT %s",
                                     (limit,))
            return [OutboxRow(**row) for row in await cur.fetchall()]

    async def settle(self, ids: list[int], state: str, now: datetime, reason: str | None = None) -> list[OutboxRow]:
        """queued -> sent | fallback | expired for these parts (those still queued), and their runs' delivery."""
        assert state in ("sent", "fallback", "expired")
        async with self._tx() as conn:
            cur = await conn.execute(
                f"UPDATE outbox SET state = %s, done_at = %s, reason = coalesce(%s, reason), next_try_at = NULL "
                f"WHERE id = ANY(%s) AND state = 'queued' RETURNING {_OUTBOX_FIELDS}", (state, now, reason, ids))
            rows = [OutboxRow(**row) for row in await cur.fetchall()]
            runs = sorted({row.task_run_id for row in rows if row.task_run_id is not None})
            if runs:
                await conn.execute(_SETTLE_RUNS, (runs,))
            return rows

    async def note_waiting(self, ids: list[int], reason: str) -> None:
        """Why these queued parts wait (window shut, budget spent …); no attempt counted."""
        async with self._conn() as conn:
            await conn.execute("UPDATE outbox SET reason = %s WHERE id = ANY(%s) AND state = 'queued'", (reason, ids))

    async def note_retry(self, row_id: int, reason: str, next_try_at: datetime | None) -> None:
        """Why this queued part waits and when it may be tried next (None: whenever the channel takes it);
        no attempt counted."""
        async with self._conn() as conn:
            await conn.execute("UPDATE outbox SET reason = %s, next_try_at = %s WHERE id = %s AND state = 'queued'",
                               (reason, next_try_at, row_id))

    async def note_failure(self, row_id: int, reason: str, next_try_at: datetime) -> int:
        """A failed attempt: count it, say why, and not again before `next_try_at`; returns the attempts."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE outbox SET attempts = attempts + 1, reason = %s, next_try_at = %s WHERE id = %s "
                "AND state = 'queued' RETURNING attempts", (reason, next_try_at, row_id))
            row = await cur.fetchone()
            return 0 if row is None else row["attempts"]

    async def expire_queued(self, created_before: datetime, now: datetime) -> list[OutboxRow]:
        """Every part queued since before `created_before`: expired."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT id FROM outbox WHERE state = 'queued' AND created_at < %s",
                                     (created_before,))
            ids = [row["id"] for row in await cur.fetchall()]
        return await self.settle(ids, "expired", now, "expired") if ids else []

    async def drop_queued(self, channels: list[str], now: datetime) -> list[OutboxRow]:
        """At start: parts queued for these channels (a past terminal session) end as expired, untold."""
        async with self._conn() as conn:
            cur = await conn.execute("UPDATE outbox SET noticed = true WHERE state = 'queued' AND channel = ANY(%s) "
                                     "RETURNING id", (channels,))
            ids = [row["id"] for row in await cur.fetchall()]
        return await self.settle(ids, "expired", now, "restart") if ids else []

    async def take_expired_notice(self, user_id: str) -> int:
        """How many of the user's messages expired since they were last told (and mark them told)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "WITH told AS (UPDATE outbox SET noticed = true WHERE user_id = %s AND state = 'expired' "
                "AND NOT noticed RETURNING kind, client_id) "
                "SELECT count(DISTINCT split_part(client_id, '.', 1)) AS n FROM told", (user_id,))
            return (await cur.fetchone())["n"]

    async def last_deliveries(self) -> dict[int, str]:
        """Each task's latest run's delivery (tasks whose latest run has none are left out)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT ON (task_id) task_id, delivery FROM task_runs ORDER BY task_id, id DESC")
            return {row["task_id"]: row["delivery"] for row in await cur.fetchall() if row["delivery"]}

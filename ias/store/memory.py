"""The memories' SQL: each write, confirmation and deletion committed with its audit row.

A memory's row says who it came from (`source`), the owner's message of the turn it was written in
(`said`), whether that turn had read untrusted content (`tainted`) and whether it may be used
(`status`: `active`, or `unverified` until the owner confirms it). Every change is one statement
scoped to its user (`WHERE user_id = %s`), so one user can never touch another's memories.

Not handled: what is remembered, ranked or shown (`ias/memory.py`); rows are returned as stored
and checked there.
"""
from __future__ import annotations

from dataclasses import fields, replace

from .audit import AuditLog
from .records import AuditEntry, MemoryRow


_FIELDS = ", ".join(f.name for f in fields(MemoryRow))


class Memories(AuditLog):
    """The memories' queries."""

    async def add_memory(self, user_id: str, text: str, source: str, status: str, tainted: bool,
                         said: str | None, entry: AuditEntry) -> MemoryRow:
        """Insert a memory and its audit row together (the row's id is added to `entry.detail`)."""
        async with self._tx() as conn:
            cur = await conn.execute(
                f"INSERT INTO memories (user_id, text, source, status, tainted, said) VALUES (%s, %s, %s, %s, %s, %s) "
                f"RETURNING {_FIELDS}", (user_id, text, source, status, tainted, said))
            row = MemoryRow(**await cur.fetchone())
            head = await self._append(conn, _with_id(entry, row.id))
        self._advance(head)
        return row

    async def confirm_memory(self, user_id: str, memory_id: int, entry: AuditEntry) -> MemoryRow | None:
        """Make the user's unverified memory `memory_id` active, with its audit row; None when the user has no
        unverified memory of that id."""
        return await self._change(
            f"UPDATE memories SET status = 'active', confirmed_at = clock_timestamp() "
            f"WHERE id = %s AND user_id = %s AND status = 'unverified' RETURNING {_FIELDS}", memory_id, user_id, entry)

    async def delete_memory(self, user_id: str, memory_id: int, entry: AuditEntry) -> MemoryRow | None:
        """Delete the user's memory `memory_id`, with its audit row; None when the user has none of that id."""
        return await self._change(f"DELETE FROM memories WHERE id = %s AND user_id = %s RETURNING {_FIELDS}",
                                  memory_id, user_id, entry)

    async def _change(self, sql: str, memory_id: int, user_id: str, entry: AuditEntry) -> MemoryRow | None:
        async with self._tx() as conn:
            cur = await conn.execute(sql, (memory_id, user_id))
            found = await cur.fetchone()
            if found is None:
                return None
            row = MemoryRow(**found)
            head = await self._append(conn, _with_id(entry, row.id))
        self._advance(head)
        return row

    async def memories(self, user_id: str, status: str | None = None, limit: int | None = None) -> list[MemoryRow]:
        """The user's memories (of `status`, or all), newest first; `limit` None for every one."""
        where = "" if status is None else "AND status = %s"
        args = (user_id,) if status is None else (user_id, status)
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_FIELDS} FROM memories WHERE user_id = %s {where} "
                                     f"ORDER BY id DESC LIMIT %s", (*args, limit))
            return [MemoryRow(**row) for row in await cur.fetchall()]

    async def memory_signature(self, user_id: str) -> tuple[int, int]:
        """How many active memories the user has and the sum of their ids: changed by any add, confirm or
        delete of an active memory, whichever process made it."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT count(*) AS n, coalesce(sum(id), 0) AS s FROM memories "
                                     "WHERE user_id = %s AND status = 'active'", (user_id,))
            row = await cur.fetchone()
            return int(row["n"]), int(row["s"])

    async def memory_count(self, user_id: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM memories WHERE user_id = %s", (user_id,))
            return (await cur.fetchone())["n"]


def _with_id(entry: AuditEntry, memory_id: int) -> AuditEntry:
    """`entry` with `memory=ID` in front of its detail: the audit row names the memory it changed."""
    return replace(entry, detail=f"memory={memory_id}" + (f" {entry.detail}" if entry.detail else ""))

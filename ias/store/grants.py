"""The grants' SQL: create one, read a call's candidates, use one (compare-and-set), list and revoke.

Every change commits with its audit row. A use is bound to the row still being exactly the one the
caller verified (every field its MAC covers, the MAC itself, and the uses it saw), so two equal calls
racing for the last use cannot both win and a row changed meanwhile is not used.

Not handled: the MAC, the lookup digest and what a grant allows (`ias/grants.py`); this module
never decides whether a row counts.
"""
from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime

from psycopg.types.json import Jsonb

from ..limits import GRANT_CANDIDATES_MAX
from .audit import AuditLog
from .records import AuditEntry, Grant

_GRANT_FIELDS = ", ".join(f.name for f in fields(Grant))
# Still usable at `now` (the daemon's wall clock): not revoked, not used up, not expired.
_USABLE = "revoked_at IS NULL AND (uses_max IS NULL OR uses < uses_max) AND expires_at > %s"


def _grant(row: dict | None) -> Grant | None:
    return None if row is None else Grant(**row)


class Grants(AuditLog):
    """The grants' queries."""

    async def grant_id(self) -> int:
        """A fresh grant id (the MAC covers it, so it is known before the row is written)."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT nextval(pg_get_serial_sequence('grants', 'id')) AS id")
            return (await cur.fetchone())["id"]

    async def create_grant(self, grant: Grant, lookup: str, entry: AuditEntry) -> Grant:
        """Insert `grant` (id from `grant_id`, params from `normalised`) and its audit row together."""
        async with self._tx() as conn:
            cur = await conn.execute(
                f"INSERT INTO grants (id, user_id, skill_name, params, task_id, uses_max, uses, expires_at, "
                f"approval_id, lookup, mac) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"RETURNING {_GRANT_FIELDS}",
                (grant.id, grant.user_id, grant.skill_name, Jsonb(grant.params), grant.task_id, grant.uses_max,
                 grant.uses, grant.expires_at, grant.approval_id, lookup, grant.mac))
            row = await cur.fetchone()
            head = await self._append(conn, entry)
        self._advance(head)
        return _grant(row)

    async def grant_candidates(self, lookup: str, params: dict, task_id: int | None,
                               now: datetime) -> tuple[dict, list[Grant]]:
        """`params` as stored (`normalised`), and the usable rows under `lookup` holding exactly them, for a
        call of `task_id` (None: not a task's), a task's own grants first: one round trip."""
        async with self._conn() as conn, conn.pipeline():
            normal = await conn.execute("SELECT %s::jsonb AS value", (Jsonb(params),))
            cur = await conn.execute(
                f"SELECT {_GRANT_FIELDS} FROM grants WHERE lookup = %s AND params::text = (%s::jsonb)::text "
                f"AND {_USABLE} AND (task_id IS NULL OR task_id = %s) ORDER BY task_id IS NULL, id LIMIT %s",
                (lookup, Jsonb(params), now, task_id, GRANT_CANDIDATES_MAX))
            return (await normal.fetchone())["value"], [Grant(**row) for row in await cur.fetchall()]

    async def use_grant(self, seen: Grant, now: datetime, entry: AuditEntry) -> Grant | None:
        """uses + 1 on the row `seen` (verified by the caller), with its audit row; None if the row is no
        longer exactly that (used meanwhile, revoked, expired, or changed in any field the MAC covers)."""
        head = None
        async with self._conn() as conn, conn.pipeline(), conn.transaction():      # BEGIN goes with the UPDATE
            cur = await conn.execute(
                f"UPDATE grants SET uses = uses + 1 WHERE id = %s AND uses = %s AND user_id = %s AND skill_name = %s "
                f"AND params::text = (%s::jsonb)::text AND task_id IS NOT DISTINCT FROM %s "
                f"AND uses_max IS NOT DISTINCT FROM %s AND approval_id = %s AND mac = %s "
                f"AND expires_at = %s AND {_USABLE} RETURNING {_GRANT_FIELDS}",
                (seen.id, seen.uses, seen.user_id, seen.skill_name, Jsonb(seen.params), seen.task_id, seen.uses_max,
                 seen.approval_id, seen.mac, seen.expires_at, now))
            row = _grant(await cur.fetchone())
            if row is not None:
                head = await self._append(conn, entry)
        self._advance(head)
        return row

    async def grants(self, user_id: str, now: datetime, limit: int) -> list[Grant]:
        """`user_id`'s usable grants, oldest first (the MAC is the caller's to check)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_GRANT_FIELDS} FROM grants WHERE user_id = %s AND {_USABLE} ORDER BY id LIMIT %s",
                (user_id, now, limit))
            return [Grant(**row) for row in await cur.fetchall()]

    async def revoke_grants(self, user_id: str, grant_id: int | None, now: datetime,
                            entry: AuditEntry) -> list[int]:
        """Revoke `user_id`'s usable grant `grant_id` (None: all of them); the ids revoked, each with a copy of
        `entry` whose detail names it, in one transaction."""
        head = None
        async with self._tx() as conn:
            cur = await conn.execute(
                f"UPDATE grants SET revoked_at = %s WHERE user_id = %s AND (%s::bigint IS NULL OR id = %s) "
                f"AND {_USABLE} RETURNING id", (now, user_id, grant_id, grant_id, now))
            ids = sorted(row["id"] for row in await cur.fetchall())
            for revoked in ids:
                head = await self._append(conn, replace(entry, detail=f"grant={revoked}"))
        self._advance(head)
        return ids

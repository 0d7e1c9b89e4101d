"""The approvals' SQL: each transition one compare-and-set UPDATE written with its audit row.

Not handled: codes, their HMAC and the owner's replies (`ias/approval.py`).
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..errors import StoreError
from .audit import AuditLog
from .records import Approval, AuditEntry

_APPROVAL_FIELDS = "id, created_at, expires_at, user_id, skill_name, params, code_hash, attempts_left, status, result, consumed_at"
# The row is still the one the daemon rendered: same user, skill, HMAC and params (jsonb text, so
# 1 and 1.0 differ). The values come from `_bound_args`.
_BOUND_TO = "user_id = %s AND skill_name = %s AND code_hash = %s AND params::text = (%s::jsonb)::text"


def _bound_args(bound: Approval) -> tuple:
    return (bound.user_id, bound.skill_name, bound.code_hash, Jsonb(bound.params))


def _approval(row: dict | None) -> Approval | None:
    return None if row is None else Approval(**row)


class Approvals(AuditLog):
    """The approvals' queries: each state change commits with its audit row."""

    async def normalised(self, value: Any) -> Any:
        """`value` as a jsonb column holds it: the boundary rule, then jsonb's own numbers and keys.

        A second round trip changes nothing, so a hash over the result is over what is stored.
        """
        async with self._conn() as conn:
            cur = await conn.execute("SELECT %s::jsonb AS value", (Jsonb(value),))
            return (await cur.fetchone())["value"]

    async def create_approval(self, approval_id: uuid.UUID, user_id: str, skill_name: str, params: dict,
                              timeout: float, code_hash: str, entry: AuditEntry) -> Approval:
        """Insert a pending approval and its audit row together.

        `params` come from `normalised()`: verification reads them back and hashes them again.
        """
        try:
            async with self._tx() as conn:
                cur = await conn.execute(
                    f"INSERT INTO pending_approvals (id, expires_at, user_id, skill_name, params, code_hash) "
                    f"VALUES (%s, clock_timestamp() + %s * interval '1 second', %s, %s, %s, %s) "
                    f"RETURNING {_APPROVAL_FIELDS}",
                    (approval_id, timeout, user_id, skill_name, Jsonb(params), code_hash))
                row = await cur.fetchone()
                head = await self._append(conn, entry)
        except psycopg.errors.UniqueViolation:
            raise StoreError(f"another approval is already pending for {user_id}") from None
        self._advance(head)
        return _approval(row)

    async def approval(self, approval_id: uuid.UUID) -> Approval | None:
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_APPROVAL_FIELDS} FROM pending_approvals WHERE id = %s", (approval_id,))
            return _approval(await cur.fetchone())

    async def approvals(self, include_closed: bool = False, limit: int | None = 50) -> list[Approval]:
        """Pending (or all) approvals, newest first; `limit` None for every one."""
        where = "" if include_closed else "WHERE status = 'pending'"
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_APPROVAL_FIELDS} FROM pending_approvals {where} ORDER BY created_at DESC LIMIT %s", (limit,))
            return [_approval(row) for row in await cur.fetchall()]

    async def _transition(self, sql: str, args: tuple, entry: AuditEntry) -> Approval | None:
        """Run one compare-and-set UPDATE … RETURNING and, if it matched, its audit row, together.

        The one thing the SQL decides is written as it decided: an attempt that used up the
        last one leaves the row rejected, and its audit row says approval_rejected.
        """
        head = None
        async with self._tx() as conn:
            cur = await conn.execute(sql, args)
            row = _approval(await cur.fetchone())
            if row is not None:
                if row.status == "rejected" and entry.decision == "wrong_code":
                    entry = replace(entry, event="approval_rejected", decision="rejected")
                head = await self._append(conn, entry)
        self._advance(head)
        return row

    async def approve(self, bound: Approval, code_hash: str, entry: AuditEntry,
                      within_deadline: bool = False) -> Approval | None:
        """pending → approved, if still pending, unexpired and exactly `bound`; None otherwise.

        `bound` is the daemon's own copy of the row (what the owner was shown) and `code_hash`
        the HMAC of the code the owner sent over it: the row approves only while it holds that
        user, skill, params and HMAC, checked by the statement that approves it, so a writer who
        changes the row first, or holds it locked and commits a change meanwhile, wins nothing.
        Unexpired means `expires_at` is ahead of the database's wall clock, unless the caller
        says `within_deadline`: its own monotonic deadline has not passed, and a jump of the
        wall clock must not end the approval early.
        """
        return await self._transition(
            f"UPDATE pending_approvals SET status = 'approved', consumed_at = clock_timestamp() "
            f"WHERE id = %s AND {_BOUND_TO} AND status = 'pending' AND attempts_left > 0 "
            f"AND (%s OR expires_at > clock_timestamp()) RETURNING {_APPROVAL_FIELDS}",
            (bound.id, *_bound_args(replace(bound, code_hash=code_hash)), within_deadline), entry)

    async def spend_attempt(self, bound: Approval, entry: AuditEntry, within_deadline: bool = False) -> Approval | None:
        """One wrong code: attempts_left - 1, and rejected when none are left; only while the row is
        `bound` and unexpired (as for `approve`).

        `entry` is the wrong_code audit row; for the last attempt it is written as approval_rejected.
        """
        return await self._transition(
            f"UPDATE pending_approvals SET attempts_left = attempts_left - 1, "
            f"status = CASE WHEN attempts_left - 1 <= 0 THEN 'rejected' ELSE status END, "
            f"consumed_at = CASE WHEN attempts_left - 1 <= 0 THEN clock_timestamp() END "
            f"WHERE id = %s AND {_BOUND_TO} AND status = 'pending' AND attempts_left > 0 "
            f"AND (%s OR expires_at > clock_timestamp()) RETURNING {_APPROVAL_FIELDS}",
            (bound.id, *_bound_args(bound), within_deadline), entry)

    async def close_approval(self, approval_id: uuid.UUID, status: str, entry: AuditEntry,
                             bound: Approval | None = None) -> Approval | None:
        """pending → rejected (cancel) or expired (timeout, delivery failure, restart), if still pending
        (and, given the daemon's copy `bound`, still exactly that row)."""
        assert status in ("rejected", "expired")
        if bound is None:                       # a restart: no copy survives the process that asked
            return await self._transition(
                f"UPDATE pending_approvals SET status = %s, consumed_at = clock_timestamp() "
                f"WHERE id = %s AND status = 'pending' RETURNING {_APPROVAL_FIELDS}",
                (status, approval_id), entry)
        return await self._transition(
            f"UPDATE pending_approvals SET status = %s, consumed_at = clock_timestamp() "
            f"WHERE id = %s AND {_BOUND_TO} AND status = 'pending' RETURNING {_APPROVAL_FIELDS}",
            (status, approval_id, *_bound_args(bound)), entry)

    async def close_tampered(self, approval_id: uuid.UUID, entry: AuditEntry) -> None:
        """Another writer changed (or approved, or deleted) this approval: end it as expired, whatever
        it says now, and write its `tampered` audit row, together."""
        async with self._tx() as conn:
            await conn.execute("UPDATE pending_approvals SET status = 'expired', "
                               "consumed_at = coalesce(consumed_at, clock_timestamp()) "
                               "WHERE id = %s AND status IN ('pending', 'approved')", (approval_id,))
            head = await self._append(conn, entry)
        self._advance(head)

    async def record_result(self, approval_id: uuid.UUID, result: dict) -> None:
        async with self._conn() as conn:
            await conn.execute("UPDATE pending_approvals SET result = %s WHERE id = %s AND result IS NULL",
                               (Jsonb(result), approval_id))

"""The audit log's SQL: appending a keyed row (one chain across every process), reading rows,
a verification snapshot, pruning the oldest rows behind a keyed checkpoint, calls in flight.

Not handled: computing or checking values (`auditchain`), redaction (`audit`).
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import AsyncIterator, Callable

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Literal
from psycopg.types.json import Jsonb

from .. import auditchain
from ..auditchain import AuditChain, Checkpoint, Head
from ..errors import IasError, StoreError
from ..limits import AUDIT_BATCH, POOL_SIZE
from ..supervisor import Supervisor
from .pool import Pool, first_line
from .records import AuditEntry, AuditRow, ChainRow, Pruned

log = logging.getLogger(__name__)

AUDIT_LOCK = 7308199101          # transaction advisory lock serialising audit appends (one chain, every process)
_AUDIT_COLUMNS = [f.name for f in fields(AuditEntry)]
_AUDIT_TYPES = {"event": "text", "user_id": "text", "skill_name": "text", "params": "jsonb", "risk": "text",
                "approval_id": "uuid", "decision": "text", "exit_code": "integer", "duration_ms": "integer",
                "output_size": "bigint", "truncated": "boolean", "detail": "text"}
# Under the append lock: the next id, the time and the previous value, and the entry's values as
# the columns will hold them (params as jsonb's text), which is what the keyed value covers.
_AUDIT_PREPARE = (
    "SELECT nextval(pg_get_serial_sequence('audit_log', 'id')) AS id, clock_timestamp() AS at, "
    + ", ".join(f"%s::{_AUDIT_TYPES[name]}{'::text' if name == 'params' else ''} AS {name}" for name in _AUDIT_COLUMNS)
    + ", coalesce((SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1), '') AS prev_hash, "
    "(SELECT hash FROM audit_log WHERE id = %s) AS head_value")
_CHAIN_COLUMNS = ["id", "at", *_AUDIT_COLUMNS, "prev_hash", "hash"]
_AUDIT_INSERT = (f"INSERT INTO audit_log ({', '.join(_CHAIN_COLUMNS)}) VALUES ("
                 + ", ".join("%s::jsonb" if name == "params" else "%s" for name in _CHAIN_COLUMNS) + ")")
# Every row as the chain covers it, as auditchain.LINK_FIELDS: rows from before the keyed chain (a
# bare SHA-256 written by the old trigger) get the old rule's digest, spelt out here with built-ins
# only, so that replacing or dropping a function in the database cannot vouch for them.
_AUDIT_CHAIN_ROWS = (
    "SELECT a.id, (extract(epoch FROM a.at) * 1000000)::int8, a.event, a.user_id, a.skill_name, a.params::text, "
    "a.risk, a.approval_id::text, a.decision, a.exit_code, a.duration_ms, a.output_size, a.truncated, a.detail, "
    f"a.prev_hash, a.hash, CASE WHEN NOT pg_catalog.starts_with(a.hash, '{auditchain.KEYED}') THEN "
    "pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_build_array("
    "a.prev_hash, a.id, extract(epoch FROM a.at)::text, a.event, a.user_id, a.skill_name, a.params, a.risk, "
    "a.approval_id, a.decision, a.exit_code, a.duration_ms, a.output_size, a.truncated, a.detail)::text, "
    "'UTF8')), 'hex') END FROM audit_log a WHERE a.id BETWEEN %s AND %s ORDER BY a.id")


@dataclass(frozen=True, slots=True)
class ChainView:
    """One snapshot of the audit log for verification (`Store.audit_chain`): the checkpoint a prune left
    (None: never pruned), the snapshot's id (for `audit_chain(snapshot=…)` in another process), the
    first and last row ids (None: empty), and `rows(first, last)`: the rows with ids in that range."""
    checkpoint: Checkpoint | None
    snapshot: str
    first: int | None
    last: int | None
    rows: Callable[[int, int], AsyncIterator[list[tuple]]]


async def _batches(cur: psycopg.AsyncServerCursor, size: int) -> AsyncIterator[list]:
    """The cursor's rows, `size` at a time; each next batch is asked for before this one is handed
    out, so the server reads it while the caller checks this one."""
    pending = asyncio.ensure_future(cur.fetchmany(size))
    try:
        while rows := await pending:
            pending = asyncio.ensure_future(cur.fetchmany(size))
            await asyncio.sleep(0)                  # the FETCH goes out now
            yield rows
    finally:
        if not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


def _audit_values(entry: AuditEntry) -> list:
    values = [getattr(entry, name) for name in _AUDIT_COLUMNS]
    values[_AUDIT_COLUMNS.index("params")] = None if entry.params is None else Jsonb(entry.params)
    return values


class AuditLog(Pool):
    """The audit log's queries; rows are keyed with `chain` (None: none can be written)."""

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE, chain: AuditChain | None = None, *,
                 supervisor: Supervisor | None = None):
        super().__init__(dsn, pool_size, supervisor=supervisor)
        self.chain = chain              # None: audit rows cannot be written (nothing is audited unkeyed)
        self._lost_told = False         # the log's lost rows are logged once per store

    async def audit(self, entry: AuditEntry) -> None:
        # Pipelined: BEGIN goes with the lock and the chain read, COMMIT with the insert, so an
        # audit row costs two round trips.
        async with self._conn() as conn, conn.pipeline(), conn.transaction():
            head = await self._append(conn, entry)
        self._advance(head)

    async def _append(self, conn: psycopg.AsyncConnection, entry: AuditEntry) -> Head | None:
        """Insert `entry` as the chain's next row, inside the caller's transaction; the head to
        record once it commits (None: the log lost rows the recorded head names; it stays there).

        The advisory lock is held until that transaction ends, so appends from every process form
        one line, and the previous value is read (in a statement of its own, so its snapshot
        postdates the lock; pipelined, so no round trip more) only once every earlier append has
        committed or rolled back. The head on file is read first: it names a row committed before
        then, which the log must still hold; if not, the head stays put, so that new rows taking
        the old ids cannot cover the loss up.
        """
        if self.chain is None:
            raise StoreError("no audit chain key: audit rows cannot be written")
        try:
            head = auditchain.read_head(self.chain.head)
        except IasError:
            head = None                                 # unreadable: replaced by the next head
        async with conn.pipeline():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
            cur = await conn.execute(_AUDIT_PREPARE, [*_audit_values(entry), None if head is None else head.id])
            values = await cur.fetchone()
        held = values.pop("head_value")
        row = ChainRow(**values, hash="")
        row = replace(row, hash=auditchain.seal(self.chain.key, row))
        await conn.execute(_AUDIT_INSERT, [getattr(row, name) for name in _CHAIN_COLUMNS])
        if head is not None and held != head.value:
            if not self._lost_told:
                log.error("the audit log no longer holds row %d as recorded in %s (rows removed or altered); "
                          "the head stays there until the log is restored: run `ias audit --verify`",
                          head.id, self.chain.head)
                self._lost_told = True
            return None
        return Head(row.id, row.hash)

    def _advance(self, head: Head | None) -> None:
        """Record a committed row as the chain's head outside the database.

        The row is already committed, so a failure here is logged, not raised: the head only
        lags, and verification still covers every row up to it.
        """
        if head is None:
            return
        try:
            auditchain.advance(self.chain.head, head)
        except (OSError, IasError) as exc:
            log.error("audit chain head not recorded in %s: %s", self.chain.head,
                      getattr(exc, "strerror", None) or exc)

    async def audit_rows(self, limit: int | None = None) -> list[AuditRow]:
        """The newest `limit` rows (all when None), oldest first."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT * FROM (SELECT * FROM audit_log ORDER BY id DESC LIMIT %s) r ORDER BY id", (limit,))
            return [AuditRow(**row) for row in await cur.fetchall()]

    @asynccontextmanager
    async def audit_chain(self, batch: int = AUDIT_BATCH, *, snapshot: str | None = None) -> AsyncIterator[ChainView]:
        """One snapshot of the audit log (`ChainView`): its rows as the chain covers them (tuples, as
        auditchain.LINK_FIELDS), oldest first, `batch` at a time. `snapshot`: the id another
        process's `audit_chain` exported, whose view this one shares (while that one is open).

        Streamed through server-side cursors (binary, plain tuples, no per-row object: verification
        reads millions), so memory does not grow with the log.
        """
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if snapshot is not None:
                await conn.execute(SQL("SET TRANSACTION SNAPSHOT {}").format(Literal(snapshot)))
            else:
                snapshot = (await (await conn.execute("SELECT pg_export_snapshot() AS id")).fetchone())["id"]
            checkpoint = await self._checkpoint(conn)
            bounds = await (await conn.execute("SELECT min(id) AS first, max(id) AS last FROM audit_log")).fetchone()

            async def rows(first: int, last: int) -> AsyncIterator[list[tuple]]:
                async with conn.cursor(name=f"audit_chain_{first}", row_factory=tuple_row, binary=True) as cur:
                    await cur.execute(_AUDIT_CHAIN_ROWS, (first, last))
                    async for found in _batches(cur, batch):
                        yield found
            yield ChainView(checkpoint, snapshot, bounds["first"], bounds["last"], rows)

    async def audit_checkpoint(self) -> Checkpoint | None:
        """Where `prune_audit` last cut the log; None when it never did."""
        async with self._conn() as conn:
            return await self._checkpoint(conn)

    @staticmethod
    async def _checkpoint(conn: psycopg.AsyncConnection) -> Checkpoint | None:
        cur = await conn.execute("SELECT last_id, last_value, pruned, seal FROM audit_checkpoint")
        row = await cur.fetchone()
        return None if row is None else Checkpoint(**row)

    async def prune_audit(self, before: datetime, reason: str) -> Pruned | None:
        """Remove the audit rows older than `before` (up to the first call still in flight), in one
        transaction that appends an `audit_pruned` row saying so (`detail`: `reason` and the cut) and
        leaves a keyed checkpoint at the last removed row; None when no row is that old.

        The append-only trigger is disabled for this transaction's DELETE only (ALTER TABLE takes
        the table's exclusive lock, so no other session sees it off) and enabled again before the
        commit; a trigger an admin already disabled stays so. Needs the table's owner.
        """
        if self.chain is None:
            raise StoreError("no audit chain key: the audit log cannot be pruned")
        try:
            return await self._prune_audit(before, reason)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:                # e.g. not the table's owner: nothing was removed
            raise StoreError(f"cannot prune the audit log: {first_line(exc)}") from None

    async def _prune_audit(self, before: datetime, reason: str) -> Pruned | None:
        async with self._tx() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
            cur = await conn.execute(
                "SELECT a.id AS last_id, a.hash AS last_value, (SELECT count(*) FROM audit_log WHERE id <= a.id) AS count "
                "FROM audit_log a WHERE a.at < %s AND a.id < coalesce((SELECT min(audit_id) FROM calls_in_flight), "
                "9223372036854775807) ORDER BY a.id DESC LIMIT 1", (before,))
            cut = await cur.fetchone()
            if cut is None:
                return None
            earlier = await self._checkpoint(conn)
            pruned = cut["count"] + (earlier.pruned if earlier else 0)
            head = await self._append(conn, AuditEntry(
                "audit_pruned", detail=f"{reason}: {cut['count']} rows removed, up to row {cut['last_id']} "
                                       f"({cut['last_value']}); {pruned} in all"))
            cur = await conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'audit_log'::regclass "
                                     "AND tgname = 'audit_log_append_only' AND tgenabled <> 'D'")
            armed = await cur.fetchone() is not None
            if armed:
                await conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
            await conn.execute("DELETE FROM audit_log WHERE id <= %s", (cut["last_id"],))
            if armed:
                await conn.execute("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")
            seal = auditchain.mark(self.chain.key, cut["last_id"], cut["last_value"], pruned)
            await conn.execute(
                "INSERT INTO audit_checkpoint (last_id, last_value, pruned, seal) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (one) DO UPDATE SET last_id = excluded.last_id, last_value = excluded.last_value, "
                "pruned = excluded.pruned, seal = excluded.seal, at = clock_timestamp()",
                (cut["last_id"], cut["last_value"], pruned, seal))
        self._advance(head)
        return Pruned(cut["count"], cut["last_id"], pruned)

    async def unfinished_calls(self) -> list[AuditRow]:
        """skill_started rows with a call tag that no skill_finished or skill_interrupted row shares,
        oldest first: the calls in flight, which a trigger keeps beside the log (no scan of it)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT s.* FROM calls_in_flight c JOIN audit_log s ON s.id = c.audit_id ORDER BY s.id")
            return [AuditRow(**row) for row in await cur.fetchall()]

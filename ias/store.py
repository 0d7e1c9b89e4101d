"""PostgreSQL storage: the only module that imports psycopg, and the only one with SQL.

Autocommit connections from a small pool; `transaction()` only where a state change and its
audit row must commit together. Every approval transition is one compare-and-set UPDATE
(`WHERE status = 'pending' AND …`), so concurrent replies cannot both win; a code is checked
against `expires_at` (the database's wall clock) unless the daemon vouches that its own,
monotonic, deadline has not passed. The schema is built and upgraded by the numbered steps in `migrations.py`, run by
`open()`; not handled: downgrades (a database newer than the code is refused).

Every value is storable (the boundary rule). Each connection's adapters pass every `str`
parameter and every Jsonb value through `storable()` on the way in:
- text: a NUL character or a lone surrogate (invalid UTF-8 decoded with surrogateescape,
  `"\\ud800"` in model JSON) becomes U+FFFD, the replacement character; a valid surrogate pair
  becomes the character it encodes. The same rule applies to JSON strings and object keys
  (two keys that become equal keep the last value);
- JSON numbers: NaN, Infinity and -Infinity become the strings "NaN", "Infinity", "-Infinity";
- JSON nesting deeper than STORED_JSON_DEPTH: the deeper part becomes the string
  TOO_DEEP, walked without recursion, so no input raises RecursionError here.
Lookups use the same adapters, so a key written with such characters is found again. Only
storage is sanitised: callers keep their original values (what the model sees). An approval's
code HMAC is computed over its params as stored (`normalised()`), so a code still verifies.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, AsyncIterator, Callable

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Literal
from psycopg.types.json import Jsonb, set_json_dumps
from psycopg.types.string import StrBinaryDumper, StrDumperUnknown

from . import auditchain, migrations
from .auditchain import AuditChain, Checkpoint, Head
from .errors import IasError, StoreError
from .limits import STORED_JSON_DEPTH

log = logging.getLogger(__name__)

POOL_SIZE = 8                    # connections held at most
POOL_IDLE_CLOSE = 10.0           # seconds an unused pooled connection stays open
CONNECT_TIMEOUT = 10             # seconds
SCHEMA_LOCK = 730819910          # advisory lock class serialising migrations (second key: the schema)
AUDIT_LOCK = 7308199101          # transaction advisory lock serialising audit appends (one chain, every process)
PRUNE_BATCH = 5000               # rows per DELETE when history is pruned
AUDIT_BATCH = 2000               # rows per fetch when the whole audit log is read (verification)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row to write; `params` must already be redacted."""
    event: str
    user_id: str | None = None
    skill_name: str | None = None
    params: Any = None
    risk: str | None = None
    approval_id: uuid.UUID | None = None
    decision: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    output_size: int | None = None
    truncated: bool | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: datetime
    event: str
    user_id: str | None
    skill_name: str | None
    params: Any
    risk: str | None
    approval_id: uuid.UUID | None
    decision: str | None
    exit_code: int | None
    duration_ms: int | None
    output_size: int | None
    truncated: bool | None
    detail: str | None
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainRow(AuditRow):
    """An audit row as the chain covers it: `params` is jsonb's text (see auditchain.py)."""


@dataclass(frozen=True, slots=True)
class Pruned:
    """What `prune_audit` removed: rows this time, the last one's id, and rows removed in all."""
    count: int
    last_id: int
    total: int


# What `prune_history` removes (older than its parameter and settled), per table.
_PRUNABLE = {
    "messages": "r.at < %s",
    "outbox": "r.state <> 'queued' AND r.done_at < %s",
    "task_runs": ("r.finished_at < %s AND r.status <> 'running' AND r.delivery IS DISTINCT FROM 'queued' "
                  "AND r.id <> (SELECT max(id) FROM task_runs n WHERE n.task_id = r.task_id) "
                  "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_run_id = r.id AND o.state = 'queued')"),
    "inbound": "r.state = 'done' AND r.done_at < %s",     # a pending one is never removed
}


@dataclass(frozen=True, slots=True)
class Approval:
    id: uuid.UUID
    created_at: datetime
    expires_at: datetime
    user_id: str
    skill_name: str
    params: dict
    code_hash: str
    attempts_left: int
    status: str
    result: dict | None
    consumed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    user_id: str
    name: str
    schedule: str
    kind: str                      # "reminder" | "prompt"
    text: str
    enabled: bool
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One message part to the owner (see schema.sql `outbox`)."""
    id: int
    user_id: str
    channel: str
    kind: str                      # reply | reminder | task | notice
    text: str
    client_id: str
    created_at: datetime
    due_at: datetime
    state: str                     # queued | sent | fallback | expired
    attempts: int
    reason: str | None
    next_try_at: datetime | None
    done_at: datetime | None
    noticed: bool
    task_run_id: int | None


@dataclass(frozen=True, slots=True)
class InboundRow:
    """One message from a user, recorded on arrival (see schema.sql `inbound`)."""
    id: int
    channel: str
    user_id: str
    message_id: str | None
    text: str
    received_at: datetime
    replays: int                   # how many starts handled it again already


_TASK_FIELDS = ", ".join(f.name for f in fields(Task))
_INBOUND_FIELDS = ", ".join(f.name for f in fields(InboundRow))
_FINISH_INBOUND = "UPDATE inbound SET state = 'done', done_at = clock_timestamp() WHERE id = %s AND state = 'pending'"
_OUTBOX_FIELDS = ", ".join(f.name for f in fields(OutboxRow))
# A run's delivery, from its parts: any fallback, else all sent, else any expired, else queued.
_SETTLE_RUNS = (
    "UPDATE task_runs t SET delivery = d.delivery FROM ("
    "SELECT task_run_id, CASE WHEN bool_or(state = 'fallback') THEN 'fallback' "
    "WHEN bool_and(state = 'sent') THEN 'delivered' WHEN bool_or(state = 'expired') THEN 'expired' "
    "ELSE 'queued' END AS delivery FROM outbox WHERE task_run_id = ANY(%s) GROUP BY task_run_id) d "
    "WHERE t.id = d.task_run_id")
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
TOO_DEEP = "…(nested too deep to store)"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


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


def _text(value: str) -> str:
    """`value` with NUL and lone surrogates replaced by U+FFFD (surrogate pairs joined)."""
    if _UNSTORABLE.search(value) is None:
        return value
    joined = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return joined.replace("\x00", "\ufffd")


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE.get(value, "NaN")
    return value


def storable(value: Any) -> Any:
    """A copy of a JSON-like value that PostgreSQL accepts (the rule in the module docstring)."""
    if not isinstance(value, (dict, list, tuple)):
        return _scalar(value)
    root: list = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 1)]    # (container, slot, value, depth)
    while stack:
        parent, slot, item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)):
            parent[slot] = _scalar(item)
        elif depth > STORED_JSON_DEPTH:
            parent[slot] = TOO_DEEP
        elif isinstance(item, dict):
            parent[slot] = copy = dict.fromkeys(_scalar(key) for key in item)
            # Pushed in reverse, popped in order: of two keys made equal, the last one's value wins.
            stack.extend((copy, _scalar(key), child, depth + 1) for key, child in reversed(item.items()))
        else:
            parent[slot] = copy = [None] * len(item)
            stack.extend((copy, i, child, depth + 1) for i, child in enumerate(item))
    return root[0]


def _json_text(value: Any) -> str:
    return json.dumps(storable(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _StorableStr(StrDumperUnknown):
    def dump(self, obj: str):
        return super().dump(_text(obj))


class _StorableStrBinary(StrBinaryDumper):
    def dump(self, obj: str):
        return super().dump(_text(obj))


def _make_storable(conn: psycopg.AsyncConnection) -> None:
    """Route this connection's text and JSON parameters through the sanitiser (the store boundary)."""
    conn.adapters.register_dumper(str, _StorableStrBinary)
    conn.adapters.register_dumper(str, _StorableStr)          # last: the one `%s` uses
    set_json_dumps(_json_text, conn)


_APPROVAL_FIELDS = "id, created_at, expires_at, user_id, skill_name, params, code_hash, attempts_left, status, result, consumed_at"
# The row is still the one the daemon rendered: same user, skill, HMAC and params (jsonb text, so
# 1 and 1.0 differ). The values come from `_bound_args`.
_BOUND_TO = "user_id = %s AND skill_name = %s AND code_hash = %s AND params::text = (%s::jsonb)::text"


def _bound_args(bound: Approval) -> tuple:
    return (bound.user_id, bound.skill_name, bound.code_hash, Jsonb(bound.params))


def _audit_values(entry: AuditEntry) -> list:
    values = [getattr(entry, name) for name in _AUDIT_COLUMNS]
    values[_AUDIT_COLUMNS.index("params")] = None if entry.params is None else Jsonb(entry.params)
    return values


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _approval(row: dict | None) -> Approval | None:
    return None if row is None else Approval(**row)


async def _schema_version(conn: psycopg.AsyncConnection) -> int:
    """The highest version recorded in schema_version, 0 without one; StoreError when too new."""
    try:
        cur = await conn.execute("SELECT coalesce(max(version), 0) AS version FROM schema_version")
    except psycopg.errors.UndefinedTable:
        return 0
    version = (await cur.fetchone())["version"]
    if version > migrations.LATEST:
        raise StoreError(f"the database schema is version {version}, newer than this iAs knows "
                         f"(up to {migrations.LATEST}): upgrade iAs")
    return version


async def _migrate(conn: psycopg.AsyncConnection) -> None:
    """Apply the migrations this schema lacks, once, whichever process comes first.

    A current schema costs one SELECT, no lock and no DDL. Otherwise one transaction under an
    advisory lock keyed by the schema (concurrent starts wait, then find the work done): create
    schema_version, adopt a schema built by the unversioned code as version 1, run the rest.
    """
    try:
        if await _schema_version(conn) == migrations.LATEST:
            return
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(coalesce(current_schema(), '')))",
                               (SCHEMA_LOCK,))
            cur = await conn.execute("SELECT to_regclass('schema_version') IS NOT NULL AS versioned, "
                                     "array(SELECT t FROM unnest(%s::text[]) t WHERE to_regclass(t) IS NOT NULL) "
                                     "AS present", (list(migrations.INITIAL_TABLES),))
            found = await cur.fetchone()
            if not found["versioned"]:
                await conn.execute(migrations.VERSION_TABLE)
                if len(found["present"]) == len(migrations.INITIAL_TABLES):
                    await conn.execute("INSERT INTO schema_version (version) VALUES (1)")
                    log.info("adopted the existing unversioned schema as version 1")
                elif found["present"]:
                    raise StoreError("the database schema holds some of iAs's tables "
                                     f"({', '.join(found['present'])}) but no schema_version; not touching it")
            version = await _schema_version(conn)
            while version < migrations.LATEST:
                version += 1
                await conn.execute(migrations.MIGRATIONS[version - 1])
                await conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
                log.info("applied schema migration %d", version)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise StoreError(f"cannot bring the database schema to version {migrations.LATEST}: "
                         f"{_first_line(exc)}") from None


class Store:
    """A pool of autocommit connections to one database, with every query iAs makes."""

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE, chain: AuditChain | None = None):
        self.dsn = dsn
        self.chain = chain              # None: audit rows cannot be written (nothing is audited unkeyed)
        self._lost_told = False         # the log's lost rows are logged once per store
        self._size = pool_size
        self._idle: list[tuple[psycopg.AsyncConnection, float]] = []    # with the time each came back
        self._closing: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(pool_size)
        self._listen_conn: psycopg.AsyncConnection | None = None

    @classmethod
    async def open(cls, dsn: str, pool_size: int = POOL_SIZE, chain: AuditChain | None = None) -> "Store":
        """Connect and bring the schema up to date; raise StoreError when unreachable or too new.

        `chain`: the key and head file audit rows are written with (`AuditChain.derive`).
        """
        store = cls(dsn, pool_size, chain)
        try:
            async with store._conn() as conn:
                await _migrate(conn)
        except BaseException:
            await store.close()
            raise
        return store

    async def _connect(self) -> psycopg.AsyncConnection:
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, row_factory=dict_row,
                                                         connect_timeout=CONNECT_TIMEOUT)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {_first_line(exc)}") from None
        except (psycopg.Error, UnicodeError) as exc:     # a malformed DSN (ProgrammingError), or not UTF-8
            raise StoreError(f"invalid database connection string: {_first_line(exc)}") from None
        _make_storable(conn)
        return conn

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._slots:
            conn = self._idle.pop()[0] if self._idle else await self._connect()
            try:
                yield conn
            except psycopg.OperationalError as exc:
                raise StoreError(f"database error: {_first_line(exc)}") from exc
            finally:
                # Only a healthy, idle connection goes back: one interrupted mid-query
                # (cancelled task, broken socket) is closed instead.
                if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
                    await conn.close()
                else:
                    self._idle.append((conn, time.monotonic()))
                    asyncio.get_running_loop().call_later(POOL_IDLE_CLOSE, self._close_idle)

    @property
    def idle_connections(self) -> int:
        """Pooled connections open and unused right now (the LISTEN connection not counted)."""
        return len(self._idle)

    def _close_idle(self) -> None:
        """Close connections unused for POOL_IDLE_CLOSE seconds: each idle backend costs the server
        a few MB, and an idle daemon needs none but its LISTEN connection."""
        cutoff = time.monotonic() - POOL_IDLE_CLOSE + 0.01
        stale = [conn for conn, returned in self._idle if returned <= cutoff]
        self._idle = [(conn, returned) for conn, returned in self._idle if returned > cutoff]
        for conn in stale:
            task = asyncio.ensure_future(conn.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._conn() as conn, conn.transaction():
            yield conn

    async def close(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._listen_conn is not None:
            await self._listen_conn.close()
        self._listen_conn = None

    async def reconnect(self) -> None:
        """Drop the idle connections (they may predate an outage) and check that a new one works.

        Raises StoreError while the database is unreachable.
        """
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()
        async with self._conn() as conn:
            await conn.execute("SELECT 1")

    # -- audit ----------------------------------------------------------------------------
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
            raise StoreError(f"cannot prune the audit log: {_first_line(exc)}") from None

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

    async def prune_history(self, before: datetime, batch: int = PRUNE_BATCH) -> dict[str, int]:
        """Remove what is older than `before` and settled: conversation messages, outbox rows no
        longer queued, finished task runs (never a task's newest run, one still running or with
        a message still queued). Rows per table removed; in batches of `batch`, each its own
        transaction, so the daemon's other work never waits long."""
        removed = {}
        async with self._conn() as conn:
            for table, where in _PRUNABLE.items():
                removed[table] = 0
                while True:
                    cur = await conn.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} r "
                                             f"WHERE {where} LIMIT %s)", (before, batch))
                    removed[table] += cur.rowcount
                    if cur.rowcount < batch:
                        break
        return removed

    # -- approvals --------------------------------------------------------------------------
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

    # -- conversation history ---------------------------------------------------------------
    async def append_messages(self, user_id: str, messages: list[dict]) -> None:
        """Append chat messages (OpenAI message dicts) to the user's history, in order, atomically."""
        if not messages:
            return
        async with self._conn() as conn:       # one statement: a turn may answer thousands of refused calls
            await conn.execute("INSERT INTO messages (user_id, message) SELECT %s, m "
                               "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(m, n) ORDER BY n",
                               (user_id, "[" + ",".join(map(_json_text, messages)) + "]"))

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
    async def record_inbound(self, channel: str, user_id: str, message_id: str | None, text: str) -> int | None:
        """Record a message on arrival, pending; its row id, or None when its id was seen before (a
        redelivery: not recorded again)."""
        async with self._tx() as conn:
            if message_id is not None:
                cur = await conn.execute("INSERT INTO seen_messages (channel, message_id) VALUES (%s, %s) "
                                         "ON CONFLICT DO NOTHING RETURNING 1", (channel, message_id))
                if await cur.fetchone() is None:
                    return None
            cur = await conn.execute("INSERT INTO inbound (channel, user_id, message_id, text) "
                                     "VALUES (%s, %s, %s, %s) RETURNING id", (channel, user_id, message_id, text))
            return (await cur.fetchone())["id"]

    async def finish_inbound(self, inbound_id: int) -> None:
        """The message's outcome is stored: it is not handled again."""
        async with self._conn() as conn:
            await conn.execute(_FINISH_INBOUND, (inbound_id,))

    async def count_replays(self, ids: list[int]) -> None:
        """These pending messages are being handled again by this start."""
        async with self._conn() as conn:
            await conn.execute("UPDATE inbound SET replays = replays + 1 WHERE id = ANY(%s)", (ids,))

    async def pending_inbound(self) -> list[InboundRow]:
        """Messages recorded but not handled (a restart, a SIGTERM or an outage came first), oldest first."""
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_INBOUND_FIELDS} FROM inbound WHERE state = 'pending' ORDER BY id")
            return [InboundRow(**row) for row in await cur.fetchall()]

    # -- scheduled tasks --------------------------------------------------------------------
    async def add_task(self, user_id: str, name: str, schedule: str, kind: str, text: str,
                       next_run_at: datetime | None, created_at: datetime) -> Task:
        """Insert a task; `created_at` is the anchor its interval schedule was computed from."""
        async with self._conn() as conn:
            cur = await conn.execute(
                f"INSERT INTO scheduled_tasks (user_id, name, schedule, kind, text, enabled, next_run_at, created_at) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_TASK_FIELDS}",
                (user_id, name, schedule, kind, text, next_run_at is not None, next_run_at, created_at))
            return Task(**await cur.fetchone())

    async def task(self, task_id: int) -> Task | None:
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_TASK_FIELDS} FROM scheduled_tasks WHERE id = %s", (task_id,))
            row = await cur.fetchone()
            return None if row is None else Task(**row)

    async def tasks(self, include_disabled: bool = True) -> list[Task]:
        where = "" if include_disabled else "WHERE enabled"
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_TASK_FIELDS} FROM scheduled_tasks {where} ORDER BY id")
            return [Task(**row) for row in await cur.fetchall()]

    async def update_task(self, task_id: int, *, name: str, schedule: str, kind: str, text: str,
                          enabled: bool, next_run_at: datetime | None) -> Task | None:
        """Replace a task's fields (the caller computed next_run_at from the schedule)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                f"UPDATE scheduled_tasks SET name = %s, schedule = %s, kind = %s, text = %s, enabled = %s, "
                f"next_run_at = %s, updated_at = clock_timestamp() WHERE id = %s RETURNING {_TASK_FIELDS}",
                (name, schedule, kind, text, enabled, next_run_at, task_id))
            row = await cur.fetchone()
            return None if row is None else Task(**row)

    async def delete_task(self, task_id: int) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute("DELETE FROM scheduled_tasks WHERE id = %s", (task_id,))
            return cur.rowcount == 1

    async def due_tasks(self, now: datetime) -> list[Task]:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_TASK_FIELDS} FROM scheduled_tasks WHERE enabled AND next_run_at <= %s "
                f"ORDER BY next_run_at, id", (now,))
            return [Task(**row) for row in await cur.fetchall()]

    async def next_due(self) -> datetime | None:
        async with self._conn() as conn:
            cur = await conn.execute("SELECT min(next_run_at) AS due FROM scheduled_tasks WHERE enabled")
            return (await cur.fetchone())["due"]

    async def claim_slot(self, task_id: int, slot: datetime, next_run_at: datetime | None) -> int | None:
        """Take one due slot: advance the task past it and record the run, in one statement.

        Only the caller whose compare-and-set moves next_run_at away from `slot` gets a run id;
        every other scheduler (another loop, another process) gets None.
        """
        async with self._conn() as conn:
            cur = await conn.execute(
                "WITH claimed AS (UPDATE scheduled_tasks SET next_run_at = %s, enabled = %s, "
                "updated_at = clock_timestamp() WHERE id = %s AND enabled AND next_run_at = %s RETURNING id) "
                "INSERT INTO task_runs (task_id, slot) SELECT id, %s FROM claimed "
                "ON CONFLICT (task_id, slot) DO NOTHING RETURNING id",
                (next_run_at, next_run_at is not None, task_id, slot, slot))
            row = await cur.fetchone()
            return None if row is None else row["id"]

    async def move_next_runs(self, moves: list[tuple[int, datetime, datetime]]) -> int:
        """Move tasks' next_run_at, each (id, from, to) only if the task is enabled and still at `from`;
        all in one transaction. Returns how many moved."""
        moved = 0
        async with self._tx() as conn:
            for task_id, old, new in moves:
                cur = await conn.execute(
                    "UPDATE scheduled_tasks SET next_run_at = %s, updated_at = clock_timestamp() "
                    "WHERE id = %s AND enabled AND next_run_at = %s", (new, task_id, old))
                moved += cur.rowcount
        return moved

    async def finish_run(self, run_id: int, status: str, reply: str | None = None, error: str | None = None) -> None:
        async with self._conn() as conn:
            await conn.execute("UPDATE task_runs SET finished_at = clock_timestamp(), status = %s, reply = %s, "
                               "error = %s WHERE id = %s", (status, reply, error, run_id))

    async def wait_for_task_change(self, timeout: float) -> bool:
        """Wait up to `timeout` s for a change to scheduled_tasks (LISTEN on a dedicated connection).

        Waits on the socket itself: psycopg's `notifies()` wakes every 0.1 s to poll, which
        would keep an idle daemon busy.
        """
        if self._listen_conn is None or self._listen_conn.closed:
            conn = await self._connect()
            try:
                await conn.execute("LISTEN ias_tasks")
            except psycopg.OperationalError as exc:     # the server went away in between
                await conn.close()
                raise StoreError(f"cannot LISTEN: {_first_line(exc)}") from None
            except BaseException:                       # cancelled mid-LISTEN: not kept, so closed here
                await conn.close()
                raise
            self._listen_conn = conn
        pgconn = self._listen_conn.pgconn
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = pgconn.socket          # read once: a lost connection has no socket left to ask for
        loop.add_reader(fd, readable.set)
        try:
            while True:
                pgconn.consume_input()
                if pgconn.notifies() is not None:
                    while pgconn.notifies() is not None:
                        pass
                    return True
                readable.clear()
                try:
                    await asyncio.wait_for(readable.wait(), max(0.0, timeout))
                except asyncio.TimeoutError:
                    return False
        except psycopg.OperationalError as exc:
            await self._listen_conn.close()
            self._listen_conn = None
            raise StoreError(f"lost the LISTEN connection: {_first_line(exc)}") from None
        finally:
            loop.remove_reader(fd)

    # -- outbox -----------------------------------------------------------------------------
    async def enqueue(self, user_id: str, channel: str, kind: str, parts: list[tuple[str, str]], now: datetime,
                      due_at: datetime, task_run_id: int | None = None,
                      inbound_id: int | None = None) -> list[OutboxRow]:
        """Queue the parts of one message ((text, client_id) each, in order), and mark its run queued and
        the inbound message it answers handled."""
        async with self._tx() as conn:
            rows = []
            for text, client_id in parts:
                cur = await conn.execute(
                    f"INSERT INTO outbox (user_id, channel, kind, text, client_id, created_at, due_at, task_run_id) "
                    f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_OUTBOX_FIELDS}",
                    (user_id, channel, kind, text, client_id, now, due_at, task_run_id))
                rows.append(OutboxRow(**await cur.fetchone()))
            if task_run_id is not None:
                await conn.execute(_SETTLE_RUNS, ([task_run_id],))
            if inbound_id is not None:
                await conn.execute(_FINISH_INBOUND, (inbound_id,))
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

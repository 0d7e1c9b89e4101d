"""PostgreSQL storage: the only package that imports psycopg, and the only one with SQL.

`Store` is composed of one part per table family (`audit`, `approvals`, `grants`, `tasks`, `outbox`,
`conversation`, `usage`, `memory`), each on the connection pool (`pool`); its records are in `records`, the boundary
rule every stored value passes (`storable`) in `values`, and `open` brings the schema up to date
(`migrate`, the numbered steps in `ias/migrations.py`).

Autocommit connections from a small pool; `transaction()` only where a state change and its
audit row must commit together. Every approval transition is one compare-and-set UPDATE
(`WHERE status = 'pending' AND …`), so concurrent replies cannot both win; a code is checked
against `expires_at` (the database's wall clock) unless the daemon vouches that its own,
monotonic, deadline has not passed. An approval's code HMAC is computed over its params as
stored (`normalised()`), so a code still verifies.

Not handled: downgrades (a database newer than the code is refused).
"""
from __future__ import annotations

from datetime import datetime

from ..auditchain import AuditChain
from ..limits import POOL_IDLE_CLOSE, POOL_SIZE, PRUNE_BATCH
from ..supervisor import Supervisor
from .approvals import Approvals
from .audit import AUDIT_LOCK, ChainView
from .conversation import Conversation
from .memory import Memories
from .grants import Grants
from .migrate import SCHEMA_LOCK, migrate
from .outbox import Outbox
from .pool import objects, without_password
from .records import (AuditEntry, AuditRow, Approval, ChainRow, Grant, InboundRow, MemoryRow, OutboxRow, Pruned, Task,
                      UsageRow)
from .tasks import Tasks
from .usage import TokenUsage
from .values import TOO_DEEP, storable

# The names callers use (the limits live in ias/limits.py; POOL_IDLE_CLOSE is re-exported for bench/).
__all__ = ["Store", "AuditEntry", "AuditRow", "ChainRow", "ChainView", "Pruned", "Approval", "Grant", "Task", "OutboxRow",
           "InboundRow", "UsageRow", "storable", "TOO_DEEP", "POOL_IDLE_CLOSE", "SCHEMA_LOCK", "AUDIT_LOCK", "objects",
           "without_password", "MemoryRow"]

# What `prune_history` removes (older than its parameter and settled), per table.
_PRUNABLE = {
    "messages": "r.at < %s",
    "outbox": "r.state <> 'queued' AND r.done_at < %s",
    "task_runs": ("r.finished_at < %s AND r.status <> 'running' AND r.delivery IS DISTINCT FROM 'queued' "
                  "AND r.id <> (SELECT max(id) FROM task_runs n WHERE n.task_id = r.task_id) "
                  "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_run_id = r.id AND o.state = 'queued')"),
    "inbound": "r.state = 'done' AND r.done_at < %s",     # a pending one is never removed
    "token_usage": "r.updated_at < %s",
}


class Store(Approvals, Grants, Tasks, Outbox, Conversation, TokenUsage, Memories):
    """A pool of autocommit connections to one database, with every query iAs makes."""

    @classmethod
    async def open(cls, dsn: str, pool_size: int = POOL_SIZE, chain: AuditChain | None = None, *,
                   supervisor: Supervisor | None = None) -> "Store":
        """Connect and bring the schema up to date; raise StoreError when unreachable or too new.

        `chain`: the key and head file audit rows are written with (`AuditChain.derive`); `supervisor`:
        the one its background work runs under (see Pool).
        """
        store = cls(dsn, pool_size, chain, supervisor=supervisor)
        try:
            async with store._conn() as conn:
                await migrate(conn)
        except BaseException:
            await store.close()
            raise
        return store

    async def prune_history(self, before: datetime, batch: int = PRUNE_BATCH) -> dict[str, int]:
        """Remove what is older than `before` and settled: conversation messages, outbox rows no
        longer queued, token counts of days last counted before it, finished task runs (never a task's newest run, one still running or with
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

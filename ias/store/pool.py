"""Connections: a small pool of autocommit connections, idle ones closed after a while, the
dedicated LISTEN connection, reconnecting after an outage, closing; and for `ias backup`/`restore`,
whether a database is empty and a connection string's password set apart for a client program.

Not handled: a connection's health between uses (one that broke while idle fails its next
query, with StoreError, and is closed then), and limiting how many clients the server takes.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from ..errors import StoreError
from ..limits import CONNECT_TIMEOUT, POOL_IDLE_CLOSE, POOL_SIZE
from ..supervisor import Supervisor
from .values import make_storable

log = logging.getLogger(__name__)


def first_line(exc: Exception) -> str:
    """The first line of a database error's message (psycopg's carry DETAIL and HINT lines after it)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Pool:
    """A pool of autocommit connections to one database; the table families' queries build on it."""

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE, *, supervisor: Supervisor | None = None):
        """`supervisor`: whose group "store" closes idle connections in the background (the daemon's;
        a command's own otherwise)."""
        self.dsn = dsn
        self._size = pool_size
        self._idle: list[tuple[psycopg.AsyncConnection, float]] = []    # with the time each came back
        self._closes = (supervisor or Supervisor()).scope("store", keep=True)
        self._slots = asyncio.Semaphore(pool_size)
        self._listen_conn: psycopg.AsyncConnection | None = None    # outside the pool: Tasks.wait_for_task_change

    async def _connect(self) -> psycopg.AsyncConnection:
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, row_factory=dict_row,
                                                         connect_timeout=CONNECT_TIMEOUT)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None
        except (psycopg.Error, UnicodeError) as exc:     # a malformed DSN (ProgrammingError), or not UTF-8
            raise StoreError(f"invalid database connection string: {first_line(exc)}") from None
        make_storable(conn)
        return conn

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._slots:
            conn = self._idle.pop()[0] if self._idle else await self._connect()
            try:
                yield conn
            except psycopg.OperationalError as exc:
                raise StoreError(f"database error: {first_line(exc)}") from exc
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
            self._closes.spawn(_close_quietly(conn), "closing an idle database connection")

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._conn() as conn, conn.transaction():
            yield conn

    async def close(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
        await self._closes.wait()
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


async def _close_quietly(conn: psycopg.AsyncConnection) -> None:
    """Close an idle connection; one that fails to close is gone anyway, which is no reason to stop iAs."""
    try:
        await conn.close()
    except (psycopg.Error, OSError) as exc:
        log.warning("closing an idle database connection failed: %s", first_line(exc))


def without_password(dsn: str) -> tuple[str, str | None]:
    """`dsn` without its password, and the password: for a client program, which gets the password in its
    environment (PGPASSWORD), never on its command line (which every local user can read)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise StoreError(f"invalid database connection string: {first_line(exc)}") from None
    password = params.pop("password", None)
    return make_conninfo(**params), None if password is None else str(password)


async def objects(dsn: str) -> int:
    """How many relations and functions the database at `dsn` holds outside PostgreSQL's own schemas:
    0 is an empty database, the only kind `ias restore` restores into (no migration is applied here)."""
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "        WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%') "
                "     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "        WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%')")
            return (await cur.fetchone())[0]
    except psycopg.OperationalError as exc:
        raise StoreError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None

"""Connections: a small pool of autocommit connections, idle ones closed after a while, the
dedicated LISTEN connection, reconnecting after an outage, closing.

Not handled: a connection's health between uses (one that broke while idle fails its next
query, with StoreError, and is closed then), and limiting how many clients the server takes.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from ..errors import StoreError
from ..limits import CONNECT_TIMEOUT, POOL_IDLE_CLOSE, POOL_SIZE
from .values import make_storable


def first_line(exc: Exception) -> str:
    """The first line of a database error's message (psycopg's carry DETAIL and HINT lines after it)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Pool:
    """A pool of autocommit connections to one database; the table families' queries build on it."""

    def __init__(self, dsn: str, pool_size: int = POOL_SIZE):
        self.dsn = dsn
        self._size = pool_size
        self._idle: list[tuple[psycopg.AsyncConnection, float]] = []    # with the time each came back
        self._closing: set[asyncio.Task] = set()
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

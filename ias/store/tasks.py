"""The scheduled tasks' SQL: the tasks, claiming due slots, their runs, and waiting for a change.

Not handled: schedules and due times (`cron`, `scheduler`), and delivering a run's reply (`outbox`).
"""
from __future__ import annotations

import asyncio
from dataclasses import fields
from datetime import datetime

import psycopg

from ..errors import StoreError
from .pool import Pool, first_line
from .records import Task

_TASK_FIELDS = ", ".join(f.name for f in fields(Task))


class Tasks(Pool):
    """The scheduled tasks' queries, and the LISTEN that wakes the scheduler on a change."""

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
                raise StoreError(f"cannot LISTEN: {first_line(exc)}") from None
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
            raise StoreError(f"lost the LISTEN connection: {first_line(exc)}") from None
        finally:
            loop.remove_reader(fd)

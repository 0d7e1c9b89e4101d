"""Schemas at the latest migration, made ahead by a process of its own while tests wait; dropped there too.

A test's fresh schema costs a CREATE SCHEMA, every migration (`Store.open`) and, after it, a DROP: a few
tenths of a second of PostgreSQL's work, most of a small test's time. `tests.support` starts this process
once per test process (`python -m tests.schema_maker DSN`) and talks to it on its stdin and stdout:

- it prints the name of each schema it made (SCHEMAS_AHEAD of them at first);
- `make` asks for one more (a test took one), `drop NAME` drops a schema a test is done with;
- at end of input it drops every schema it made that is still there, then exits.

Its logs (the store's "applied schema migration N") stay in this process: a test that checks logs never sees
another test's schema being made. Not handled: a schema a test changed is dropped like any other, never reused.
"""
from __future__ import annotations

import asyncio
import sys

import psycopg
from psycopg.conninfo import make_conninfo

from ias.store import Store

SCHEMAS_AHEAD = 3           # ready before a test asks: a test takes one as it starts


def schema_dsn(dsn: str, name: str) -> str:
    """`dsn` with its search_path set to schema `name`."""
    return make_conninfo(dsn, options=f"-c search_path={name}")


async def migrate(dsn: str) -> None:
    store = await Store.open(dsn, pool_size=1)
    await store.close()


def main(dsn: str) -> None:
    made: set[str] = set()
    counter = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        def make() -> None:
            nonlocal counter
            counter += 1
            name = f"t_pool_{counter}_{conn.info.backend_pid}"
            conn.execute(f"CREATE SCHEMA {name}")
            made.add(name)
            asyncio.run(migrate(schema_dsn(dsn, name)))
            sys.stdout.write(name + "\n")
            sys.stdout.flush()

        def drop(name: str) -> None:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            made.discard(name)

        for _ in range(SCHEMAS_AHEAD):
            make()
        for line in sys.stdin:
            order, _, name = line.strip().partition(" ")
            if order == "make":
                make()
            elif order == "drop":
                drop(name)
        for name in sorted(made):
            drop(name)


if __name__ == "__main__":
    main(sys.argv[1])

"""Bringing a database's schema to `migrations.LATEST`, once, whichever process comes first.

Not handled: downgrades (a database newer than the code is refused), and the steps themselves
(data in `ias/migrations.py`).
"""
from __future__ import annotations

import logging

import psycopg

from .. import migrations
from ..errors import StoreError
from .pool import first_line

log = logging.getLogger(__name__)

SCHEMA_LOCK = 730819910          # advisory lock class serialising migrations (second key: the schema)


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


async def migrate(conn: psycopg.AsyncConnection) -> None:
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
                         f"{first_line(exc)}") from None

"""Numbered migrations: a fresh schema, concurrent starts, adopting an unversioned schema, a newer
database, equality with schema.sql, and a second start that leaves the schema (and its triggers) alone."""
from __future__ import annotations

import asyncio
import sys
import unittest

import psycopg

from ias import migrations
from ias.errors import StoreError
from ias.store import SCHEMA_LOCK, AuditEntry, Store
from tests.support import REPO, drop_schema, fresh_schema_dsn, server_dsn, test_chain

VERSIONS = list(range(1, migrations.LATEST + 1))
AUDIT_TRIGGERS = ("audit_log_append_only", "audit_log_no_truncate")

# Each child opens a store on argv[1] once told to go, so all of them start together.
CHILD = """
import asyncio, logging, sys
from ias.store import Store
logging.basicConfig(level=logging.INFO, format="%(message)s")
async def main():
    store = await Store.open(sys.argv[1])
    await store.close()
print("ready", flush=True)
sys.stdin.readline()
asyncio.run(main())
"""

# What the database says a schema holds: every query's rows, with the schema's name replaced by S.
CATALOG = {
    "tables": "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = %(s)s",
    "columns": "SELECT table_name, column_name, ordinal_position, data_type, udt_name, column_default, "
               "is_nullable, character_maximum_length, numeric_precision, collation_name "
               "FROM information_schema.columns WHERE table_schema = %(s)s",
    "constraints": "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) "
                   "FROM pg_constraint WHERE connamespace = %(s)s::regnamespace",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s",
    "triggers": "SELECT t.tgrelid::regclass::text, t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) "
                "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE c.relnamespace = %(s)s::regnamespace AND NOT t.tgisinternal",
    "functions": "SELECT proname, pg_get_function_identity_arguments(oid), pg_get_functiondef(oid) "
                 "FROM pg_proc WHERE pronamespace = %(s)s::regnamespace",
    "sequences": "SELECT sequence_name, data_type, start_value, increment "
                 "FROM information_schema.sequences WHERE sequence_schema = %(s)s",
}


def sql(dsn: str, query: str, params: tuple | dict | None = None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def catalog(schema: str) -> dict[str, list[tuple]]:
    def plain(value):
        return value.replace(schema, "S") if isinstance(value, str) else value
    return {kind: sorted(tuple(plain(v) for v in row) for row in sql(server_dsn(), query, {"s": schema}))
            for kind, query in CATALOG.items()}


class MigrationTest(unittest.IsolatedAsyncioTestCase):
    maxDiff = None
    @classmethod
    def setUpClass(cls) -> None:
        server_dsn()        # start the cluster outside the event loop

    def schema(self) -> tuple[str, str]:
        """A fresh, empty schema (dropped after the test): (dsn, name)."""
        dsn, name = fresh_schema_dsn()
        self.addCleanup(drop_schema, name)
        return dsn, name

    async def open(self, dsn: str) -> Store:
        store = await asyncio.wait_for(Store.open(dsn, chain=test_chain(self)), 30)
        self.addAsyncCleanup(store.close)
        return store

    def versions(self, dsn: str) -> list[int]:
        return [v for v, in sql(dsn, "SELECT version FROM schema_version ORDER BY version")]

    def trigger_states(self, dsn: str) -> list[str]:
        return [s for s, in sql(dsn, "SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = 'audit_log'::regclass "
                                     "AND tgname = ANY(%s) ORDER BY tgname", (list(AUDIT_TRIGGERS),))]

    async def test_a_fresh_schema_is_built_at_the_latest_version(self):
        dsn, _ = self.schema()
        with self.assertLogs("ias.store", "INFO") as logs:
            store = await self.open(dsn)
        self.assertEqual(self.versions(dsn), VERSIONS)
        self.assertEqual([line for line in logs.output if "migration" in line],
                         [f"INFO:ias.store.migrate:applied schema migration {v}" for v in VERSIONS])
        await store.audit(AuditEntry("daemon_start"))
        self.assertEqual([row.event for row in await store.audit_rows()], ["daemon_start"])

    async def test_concurrent_starts_apply_each_migration_once(self):
        dsn, _ = self.schema()
        children = [await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, dsn, cwd=REPO, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for _ in range(8)]
        for child in children:
            self.assertEqual(await asyncio.wait_for(child.stdout.readline(), 30), b"ready\n")
        for child in children:
            child.stdin.write(b"go\n")
        outcomes = await asyncio.wait_for(asyncio.gather(*(child.communicate() for child in children)), 60)
        self.assertEqual([child.returncode for child in children], [0] * 8, [err for _, err in outcomes])
        applied = [line for _, err in outcomes for line in err.decode().splitlines() if "migration" in line]
        self.assertEqual(sorted(applied, key=lambda line: int(line.rpartition(" ")[2])),
                         [f"applied schema migration {v}" for v in VERSIONS])
        self.assertEqual(self.versions(dsn), VERSIONS)

    async def test_the_migration_lock_is_per_schema(self):
        (dsn_a, name_a), (dsn_b, _) = self.schema(), self.schema()
        with psycopg.connect(server_dsn(), autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (SCHEMA_LOCK, name_a))
            await self.open(dsn_b)                                    # another schema: not held up
            self.assertEqual(self.versions(dsn_b), VERSIONS)
            waiting = asyncio.create_task(self.open(dsn_a))
            while not sql(server_dsn(), "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'advisory' "
                                        "AND position('pg_advisory_xact_lock' IN query) > 0"):
                self.assertFalse(waiting.done())
                await asyncio.sleep(0.02)
            self.assertIsNone(sql(dsn_a, "SELECT to_regclass('audit_log')")[0][0])
            holder.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (SCHEMA_LOCK, name_a))
            await waiting
        self.assertEqual(self.versions(dsn_a), VERSIONS)

    async def test_a_schema_built_by_the_unversioned_code_is_adopted_not_rebuilt(self):
        dsn, _ = self.schema()
        sql(dsn, migrations.MIGRATIONS[0])               # what the old code applied at every start (no version table)
        sql(dsn, "INSERT INTO audit_log (event, prev_hash, hash) VALUES ('daemon_start', '', '')")
        for trigger in AUDIT_TRIGGERS:
            sql(dsn, f"ALTER TABLE audit_log DISABLE TRIGGER {trigger}")
        with self.assertLogs("ias.store", "INFO") as logs:
            store = await self.open(dsn)
        self.assertIn("INFO:ias.store.migrate:adopted the existing unversioned schema as version 1", logs.output)
        self.assertFalse([line for line in logs.output if line.endswith("applied schema migration 1")])
        self.assertEqual(self.versions(dsn), VERSIONS)
        self.assertEqual(self.trigger_states(dsn), ["D", "D"])             # an admin's choice stays
        self.assertEqual([row.event for row in await store.audit_rows()], ["daemon_start"])

    async def test_version_4_finds_the_calls_in_flight_of_an_existing_log(self):
        """The calls a version-3 log left unfinished are found after the upgrade (without the log)."""
        dsn, _ = self.schema()
        sql(dsn, migrations.VERSION_TABLE)
        for version, step in enumerate(migrations.MIGRATIONS[:3], 1):
            sql(dsn, step)
            sql(dsn, "INSERT INTO schema_version (version) VALUES (%s)", (version,))
        tags = [f"call={i:032x} pid=1 start=1" for i in range(4)]
        for event, tag in (("skill_started", tags[0]), ("skill_started", tags[1]), ("skill_finished", tags[0]),
                           ("skill_started", tags[2]), ("skill_interrupted", tags[2]), ("skill_started", tags[3]),
                           ("skill_started", "no tag")):
            sql(dsn, "INSERT INTO audit_log (event, detail, prev_hash, hash) VALUES (%s, %s, '', '')", (event, tag))
        store = await self.open(dsn)
        self.assertEqual([row.detail for row in await store.unfinished_calls()], [tags[1], tags[3]])

    async def test_some_of_the_tables_without_a_version_is_refused_untouched(self):
        dsn, name = self.schema()
        sql(dsn, "CREATE TABLE messages (id integer)")
        before = await asyncio.to_thread(catalog, name)
        with self.assertRaises(StoreError) as caught:
            await Store.open(dsn)
        self.assertEqual(str(caught.exception), "the database schema holds some of iAs's tables (messages) "
                                                "but no schema_version; not touching it")
        self.assertEqual(await asyncio.to_thread(catalog, name), before)

    async def test_a_newer_database_is_refused_untouched(self):
        dsn, name = self.schema()
        await (await Store.open(dsn)).close()
        sql(dsn, "INSERT INTO schema_version (version) VALUES (%s)", (migrations.LATEST + 1,))
        before = await asyncio.to_thread(catalog, name), self.versions(dsn)
        with self.assertRaises(StoreError) as caught:
            await Store.open(dsn)
        self.assertEqual(str(caught.exception),
                         f"the database schema is version {migrations.LATEST + 1}, newer than this iAs knows "
                         f"(up to {migrations.LATEST}): upgrade iAs")
        self.assertEqual((await asyncio.to_thread(catalog, name), self.versions(dsn)), before)

    async def test_migrations_build_what_schema_sql_describes(self):
        (migrated_dsn, migrated), (whole_dsn, whole) = self.schema(), self.schema()
        await self.open(migrated_dsn)
        sql(whole_dsn, (REPO / "schema.sql").read_text())
        built, described = await asyncio.to_thread(catalog, migrated), await asyncio.to_thread(catalog, whole)
        # the query sees them (+ version, outbox, calls_in_flight, audit_checkpoint, inbound, token_usage,
        # memories, grants)
        self.assertEqual(len(built["tables"]), len(migrations.INITIAL_TABLES) + 8)
        self.assertEqual([row[0] for row in built["functions"]],
                         ["audit_calls_in_flight", "audit_refuse", "scheduled_tasks_notify"])
        for kind in CATALOG:
            self.assertEqual(built[kind], described[kind], kind)
        self.assertEqual(self.versions(migrated_dsn), self.versions(whole_dsn))

    async def test_a_current_schema_is_only_read(self):
        """No DDL and no migration lock: it opens while every table and the lock are held by another."""
        dsn, name = self.schema()
        await (await Store.open(dsn)).close()
        for trigger in AUDIT_TRIGGERS:
            sql(dsn, f"ALTER TABLE audit_log DISABLE TRIGGER {trigger}")
        with psycopg.connect(dsn) as holder:                          # one open transaction
            holder.execute(f"LOCK TABLE {', '.join(migrations.INITIAL_TABLES)} IN ACCESS EXCLUSIVE MODE")
            holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SCHEMA_LOCK, name))
            store = await self.open(dsn)
            holder.rollback()
        self.assertEqual(self.trigger_states(dsn), ["D", "D"])             # never silently re-enabled
        self.assertEqual(self.versions(dsn), VERSIONS)
        await store.audit(AuditEntry("daemon_start"))


if __name__ == "__main__":
    unittest.main()

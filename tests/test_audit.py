"""The keyed audit chain, from the attacker's side: whoever owns the tables (triggers off, rows
edited, deleted or re-chained with any function the database has, functions replaced) cannot
make `ias audit --verify` say intact, because the key is not in the database and the newest
row is also recorded outside it."""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
import uuid
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from ias import audit, migrations
from ias.approval import load_key
from ias.auditchain import AuditChain, Head, Sealer, advance, mark, read_head, seal
from ias.errors import StoreError
from ias.store import AuditEntry, ChainRow, Store
from tests.support import FIXTURES, REPO, StoreTestCase, drop_schema, fresh_schema_dsn, slow, test_chain

# The rule the database used before the keyed chain (migration 1's audit_digest), which an
# attacker can always recreate: any SHA-256 chain is computable without a key.
OLD_DIGEST = """
CREATE OR REPLACE FUNCTION audit_digest(r audit_log) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT encode(sha256(convert_to(jsonb_build_array(
        r.prev_hash, r.id, extract(epoch FROM r.at)::text, r.event, r.user_id, r.skill_name,
        r.params, r.risk, r.approval_id, r.decision, r.exit_code, r.duration_ms, r.output_size,
        r.truncated, r.detail)::text, 'UTF8')), 'hex')
$$;
"""
# A replaced function that vouches for every row, whatever it holds.
LYING_DIGEST = """
CREATE OR REPLACE FUNCTION audit_digest(r audit_log) RETURNS text LANGUAGE sql STABLE AS $$ SELECT r.hash $$;
"""
# Another iAs process on the same database: argv = dsn, key (hex), head file.
WRITER = """
import asyncio, sys
from ias.auditchain import AuditChain
from ias.store import AuditEntry, ChainRow, Store
async def main():
    store = await Store.open(sys.argv[1], chain=AuditChain.derive(bytes.fromhex(sys.argv[2]), sys.argv[3]))
    await asyncio.gather(*(store.audit(AuditEntry("there", exit_code=i)) for i in range(10)))
    await store.close()
asyncio.run(main())
"""
CHAIN_FIELDS = ("id, at, event, user_id, skill_name, params::text AS params, risk, approval_id, decision, "
                "exit_code, duration_ms, output_size, truncated, detail, prev_hash")


class Attacker:
    """The role that owns the tables, connected straight to the database."""

    def __init__(self, dsn: str):
        self.conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)

    def close(self) -> None:
        self.conn.close()

    def run(self, statement: str, params: tuple = ()) -> list[dict]:
        """One statement with every trigger of audit_log off, and back on after."""
        self.conn.execute("ALTER TABLE audit_log DISABLE TRIGGER ALL")
        try:
            cur = self.conn.execute(statement, params)
            return cur.fetchall() if cur.description else []
        finally:
            self.conn.execute("ALTER TABLE audit_log ENABLE TRIGGER ALL")

    def ids(self) -> list[int]:
        return [row["id"] for row in self.conn.execute("SELECT id FROM audit_log ORDER BY id")]

    def rechain(self, start: int, key: bytes | None = None, stop: int | None = None) -> None:
        """Recompute prev_hash and hash of every row from id `start` on (up to `stop`, excluded): with
        the database's own digest (key None), or with the chain's algorithm under a key of the attacker's."""
        if key is None:
            self.conn.execute(OLD_DIGEST)
        self.conn.execute("ALTER TABLE audit_log DISABLE TRIGGER ALL")
        try:
            [previous] = self.conn.execute(
                "SELECT coalesce((SELECT hash FROM audit_log WHERE id < %s ORDER BY id DESC LIMIT 1), '') AS h",
                (start,)).fetchone().values()
            for row_id in [i for i in self.ids() if i >= start and (stop is None or i < stop)]:
                self.conn.execute("UPDATE audit_log SET prev_hash = %s WHERE id = %s", (previous, row_id))
                if key is None:
                    [previous] = self.conn.execute("UPDATE audit_log a SET hash = audit_digest(a) WHERE id = %s "
                                                   "RETURNING hash", (row_id,)).fetchone().values()
                else:
                    row = self.conn.execute(f"SELECT {CHAIN_FIELDS} FROM audit_log WHERE id = %s", (row_id,)).fetchone()
                    previous = seal(key, ChainRow(**row, hash=""))
                    self.conn.execute("UPDATE audit_log SET hash = %s WHERE id = %s", (previous, row_id))
        finally:
            self.conn.execute("ALTER TABLE audit_log ENABLE TRIGGER ALL")


def assert_broken(test: unittest.TestCase, verdict: audit.Verdict, *needles: str) -> None:
    """`verdict` is a break, and each needle is in one of its problem lines."""
    test.assertFalse(verdict.intact, verdict)
    for needle in needles:
        test.assertTrue(any(needle in line for line in verdict.problems), (needle, verdict.problems))


class ChainTestCase(StoreTestCase):
    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.attacker = Attacker(self.dsn)
        self.addCleanup(self.attacker.close)

    async def write(self, n: int, **fields) -> list[int]:
        for i in range(n):
            await self.store.audit(AuditEntry("skill_finished", user_id="owner", skill_name="echo", exit_code=i,
                                              **fields))
        return self.attacker.ids()

    async def check(self) -> audit.Verdict:
        return await audit.check(self.store)

    def assert_broken(self, verdict: audit.Verdict, *needles: str) -> None:
        assert_broken(self, verdict, *needles)


class KeyedChainTest(ChainTestCase):
    async def test_what_is_sealed_is_what_a_later_select_returns(self):
        """Odd values survive the round trip: jsonb reorders keys and rewrites numbers, text loses
        NUL characters, the time comes back in another zone; the chain still verifies."""
        params = {"zz": 1.10, "a": [2 ** 80, 1e300, -0.0, None, True], "nul": "a\x00b", "lone": "\ud800x",
                  "中文": "\u2028\u202e", "nested": {"b": {"c": "é"}, "a": 1}}
        await self.store.audit(AuditEntry("skill_started", user_id="o\x00wner", skill_name="s", params=params,
                                          risk="high", approval_id=uuid.uuid4(), decision="approved", exit_code=-1,
                                          duration_ms=0, output_size=2 ** 40, truncated=False, detail="d\ud800"))
        await self.store.audit(AuditEntry("daemon_start"))
        self.attacker.conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")
        verdict = await self.check()
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual((verdict.rows, verdict.unkeyed), (2, 0))
        self.assertEqual(verdict.summary(), "audit log: chain intact (2 rows)")
        [last] = self.attacker.conn.execute("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1")
        self.assertEqual(read_head(self.chain.head), Head(last["id"], last["hash"]))
        self.assertEqual(stat.S_IMODE(self.chain.head.stat().st_mode), 0o600)
        self.assertTrue(last["hash"].startswith("k1:"))

    async def test_a_row_edited_and_rechained_with_the_databases_digest_is_caught(self):
        ids = await self.write(6)
        self.attacker.run("UPDATE audit_log SET exit_code = 42 WHERE id = %s", (ids[2],))
        self.attacker.rechain(ids[2])
        self.assert_broken(await self.check(), f"row {ids[2]}: not keyed", "kept in")

    async def test_a_rechain_with_the_algorithm_but_not_the_key_is_caught(self):
        ids = await self.write(6)
        self.attacker.run("UPDATE audit_log SET detail = 'nothing happened' WHERE id = %s", (ids[3],))
        self.attacker.rechain(ids[3], key=os.urandom(32))
        verdict = await self.check()
        self.assert_broken(verdict, f"row {ids[3]}: contents do not match its keyed hash",
                           f"row {ids[-1]}: differs from the chain head")
        self.assertNotIn(f"row {ids[2]}:", "\n".join(verdict.problems))     # the rows before stay good

    async def test_the_whole_log_rechained_is_caught_through_the_head(self):
        ids = await self.write(4)
        self.attacker.run("UPDATE audit_log SET exit_code = 0")
        self.attacker.rechain(ids[0])
        self.assertTrue(self.attacker.conn.execute(
            "SELECT bool_and(hash = audit_digest(a)) AS ok FROM audit_log a").fetchone()["ok"])   # a good SHA-256 chain
        self.assertEqual(await audit.verify(self.store), [f"row {ids[-1]}: differs from the chain head kept in "
                                                          f"{self.chain.head} (row altered or re-chained)"])

    async def test_keyed_rows_without_a_head_are_a_problem(self):
        ids = await self.write(4)
        self.attacker.run("DELETE FROM audit_log WHERE id > %s", (ids[1],))
        self.chain.head.unlink()
        self.assert_broken(await self.check(), "no chain head")

    async def test_a_replaced_database_function_vouches_for_nothing(self):
        ids = await self.write(4)
        self.attacker.conn.execute(LYING_DIGEST)
        self.attacker.run("UPDATE audit_log SET exit_code = 7 WHERE id = %s", (ids[1],))
        self.assertEqual(await audit.verify(self.store),
                         [f"row {ids[1]}: contents do not match its keyed hash (row altered or re-chained)"])

    async def test_the_newest_rows_deleted_are_caught_through_the_head(self):
        ids = await self.write(6)
        self.attacker.run("DELETE FROM audit_log WHERE id > %s", (ids[2],))
        verdict = await self.check()
        self.assertEqual(verdict.problems, (f"row {ids[-1]} is missing: the chain head kept in {self.chain.head} "
                                            f"names it, the log ends at row {ids[2]} (rows removed)",))
        self.attacker.run("DELETE FROM audit_log")
        self.assert_broken(await self.check(), "the log is empty (rows removed)")

    async def test_a_truncation_covered_by_new_rows_stays_caught(self):
        """The newest rows deleted and the id sequence set back: new rows take the old ids, but the
        head stays where it was, so the log never verifies again (until restored)."""
        ids = await self.write(6)
        head = read_head(self.chain.head)
        self.attacker.run("DELETE FROM audit_log WHERE id > %s", (ids[2],))
        self.attacker.conn.execute("SELECT setval(pg_get_serial_sequence('audit_log', 'id'), %s)", (ids[2],))
        with self.assertLogs("ias.store", "ERROR") as logs:
            await self.write(5)
        self.assertEqual(len(logs.output), 1)
        self.assertIn(f"the audit log no longer holds row {ids[-1]} as recorded in {self.chain.head}", logs.output[0])
        self.assertEqual(read_head(self.chain.head), head)
        self.assertEqual(max(self.attacker.ids()), ids[-1] + 2)
        self.assert_broken(await self.check(), f"row {ids[-1]}: differs from the chain head")

    async def test_a_restored_log_is_anchored_again(self):
        ids = await self.write(5)
        self.attacker.run("DELETE FROM audit_log WHERE id > %s", (ids[1],))     # an older backup restored
        self.assert_broken(await self.check(), "rows removed")
        verdict = await audit.anchor(self.store)
        self.assertTrue(verdict.intact, verdict.problems)
        [last] = self.attacker.conn.execute("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1")
        self.assertEqual(read_head(self.chain.head), Head(last["id"], last["hash"]))
        self.assertTrue((await self.check()).intact)
        self.attacker.run("UPDATE audit_log SET exit_code = 5 WHERE id = %s", (ids[0],))
        self.assertFalse((await audit.anchor(self.store)).intact)           # a broken log is not anchored
        self.assertEqual(read_head(self.chain.head), Head(last["id"], last["hash"]))

    async def test_a_deleted_middle_row_breaks_the_chain(self):
        ids = await self.write(5)
        self.attacker.run("DELETE FROM audit_log WHERE id = %s", (ids[2],))
        self.assertEqual(await audit.verify(self.store),
                         [f"row {ids[3]}: chain broken (previous row removed or altered)"])

    async def test_a_forged_row_appended_by_hand_is_caught(self):
        ids = await self.write(2)
        [last] = self.attacker.conn.execute("SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1")
        self.attacker.conn.execute("INSERT INTO audit_log (event, prev_hash, hash) VALUES ('daemon_stop', %s, %s)",
                                   (last["hash"], "k1:" + "0" * 64))
        self.assert_broken(await self.check(), "contents do not match its keyed hash")
        await self.store.audit(AuditEntry("daemon_start"))                 # chained on, the forgery stays visible
        self.assert_broken(await self.check(), f"row {ids[-1] + 1}: contents do not match its keyed hash")

    async def test_another_key_is_named_as_such(self):
        await self.write(2)
        other = await Store.open(self.dsn, chain=AuditChain.derive(os.urandom(32), self.chain.head))
        self.addAsyncCleanup(other.close)
        self.assert_broken(await audit.check(other), "the secret key is not the one that wrote this log")

    async def test_concurrent_writers_on_two_stores_keep_one_verifiable_chain(self):
        other = await Store.open(self.dsn, chain=self.chain)
        self.addAsyncCleanup(other.close)
        await asyncio.gather(*(store.audit(AuditEntry("e", detail=str(i)))
                               for i in range(20) for store in (self.store, other)))
        verdict = await self.check()
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual(verdict.rows, 40)
        self.assertEqual(read_head(self.chain.head).id, max(self.attacker.ids()))

    async def test_writers_in_other_processes_join_the_same_chain(self):
        key = os.urandom(32)
        chain = AuditChain.derive(key, self.chain.head)
        children = [await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, self.dsn, key.hex(), str(self.chain.head), cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for _ in range(2)]
        here = await Store.open(self.dsn, chain=chain)
        self.addAsyncCleanup(here.close)
        await asyncio.gather(*(here.audit(AuditEntry("here", exit_code=i)) for i in range(10)))
        for child in children:
            _, err = await asyncio.wait_for(child.communicate(), 60)
            self.assertEqual(child.returncode, 0, err.decode())
        verdict = await audit.check(here)
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual(verdict.rows, 30)
        self.assertEqual(read_head(self.chain.head).id, max(self.attacker.ids()))

    async def test_the_log_is_read_in_batches_in_order(self):
        ids = await self.write(7)
        async with self.store.audit_chain(batch=3) as view:
            self.assertIsNone(view.checkpoint)
            self.assertEqual((view.first, view.last), (ids[0], ids[-1]))
            self.assertEqual([[row[0] for row in batch] async for batch in view.rows(view.first, view.last)],
                             [ids[:3], ids[3:6], ids[6:]])
            self.assertEqual([[row[0] for row in batch] async for batch in view.rows(ids[2], ids[3])], [ids[2:4]])

    async def test_no_key_no_audit_row_and_no_state_change(self):
        """A state change and its audit row commit together: without the chain key nothing is written."""
        keyless = await Store.open(self.dsn)
        self.addAsyncCleanup(keyless.close)
        with self.assertRaisesRegex(StoreError, "no audit chain key"):
            await keyless.create_approval(uuid.uuid4(), "owner", "s", {}, 60, "v1:x", AuditEntry("approval_requested"))
        with self.assertRaisesRegex(StoreError, "no audit chain key"):
            await keyless.audit(AuditEntry("daemon_start"))
        self.assertEqual(self.sql("SELECT count(*) FROM pending_approvals")[0][0], 0)
        self.assertEqual(self.sql("SELECT count(*) FROM audit_log")[0][0], 0)

    async def test_an_unwritable_head_is_logged_and_the_row_kept(self):
        self.chain.head.mkdir()                                      # a directory where the file should be
        with self.assertLogs("ias.store", "ERROR") as logs:
            await self.store.audit(AuditEntry("daemon_start"))
        self.assertIn("audit chain head not recorded", logs.output[0])
        self.assertEqual(self.sql("SELECT event FROM audit_log"), [("daemon_start",)])


class HeadTest(StoreTestCase):
    def test_the_head_only_moves_forward(self):
        path = self.chain.head
        advance(path, Head(5, "k1:" + "5" * 64))
        advance(path, Head(3, "k1:" + "3" * 64))                     # an older writer, committed earlier
        self.assertEqual(read_head(path), Head(5, "k1:" + "5" * 64))
        advance(path, Head(6, "k1:" + "6" * 64))
        self.assertEqual(read_head(path).id, 6)
        self.assertEqual([p.name for p in path.parent.iterdir()], ["audit.head"])
        self.assertEqual(path.read_text(), f"{6:020d} k1:{'6' * 64}\n")

    async def test_an_unreadable_head_is_a_problem(self):
        await self.store.audit(AuditEntry("daemon_start"))
        self.chain.head.write_text("garbage\n")
        self.assertEqual(await audit.verify(self.store),
                         [f"the audit chain head {self.chain.head} is not '<id> k1:<hmac>'"])


class UnkeyedRowsTest(StoreTestCase):
    """Rows the database chained before version 3: checked by their old rule, reported as unkeyed."""

    async def asyncSetUp(self) -> None:
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.addCleanup(drop_schema, self.schema_name)
        self.attacker = Attacker(self.dsn)
        self.addCleanup(self.attacker.close)
        conn = self.attacker.conn
        conn.execute(migrations.VERSION_TABLE)
        for version in (1, 2):                                      # the database as version 2 left it
            conn.execute(migrations.MIGRATIONS[version - 1])
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
        for i in range(4):
            conn.execute("INSERT INTO audit_log (event, params, exit_code, prev_hash, hash) VALUES (%s, %s, %s, '', '')",
                         ("skill_finished", json.dumps({"b": [1.5, i], "a": "x"}), i))
        self.chain = test_chain(self)
        self.store = await Store.open(self.dsn, chain=self.chain)   # migration 3
        for _ in range(3):
            await self.store.audit(AuditEntry("daemon_start"))

    async def asyncTearDown(self) -> None:
        await self.store.close()

    async def test_old_rows_are_verified_and_reported_unkeyed(self):
        verdict = await audit.check(self.store)
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual(verdict.summary(), "audit log: chain intact (7 rows; 4 rows before the keyed chain (unkeyed))")
        [first] = self.attacker.conn.execute("SELECT prev_hash FROM audit_log WHERE hash LIKE 'k1:%' ORDER BY id LIMIT 1")
        [last_old] = self.attacker.conn.execute("SELECT hash FROM audit_log WHERE hash NOT LIKE 'k1:%' "
                                                "ORDER BY id DESC LIMIT 1")
        self.assertEqual(first["prev_hash"], last_old["hash"])
        self.assertEqual(self.attacker.conn.execute("SELECT to_regproc('audit_digest') AS f").fetchone()["f"], None)

    async def test_an_edited_old_row_is_caught_even_when_the_function_lies(self):
        ids = self.attacker.ids()
        self.attacker.conn.execute(LYING_DIGEST)
        self.attacker.run("UPDATE audit_log SET exit_code = 9 WHERE id = %s", (ids[1],))
        self.assertEqual(await audit.verify(self.store), [f"row {ids[1]}: contents do not match its hash (row altered)"])

    async def test_old_rows_rechained_break_at_the_first_keyed_row(self):
        ids = self.attacker.ids()
        self.attacker.run("UPDATE audit_log SET exit_code = 9 WHERE id = %s", (ids[1],))
        self.attacker.rechain(ids[1], stop=ids[4])                      # every unkeyed row after it
        self.assertEqual(await audit.verify(self.store), [f"row {ids[4]}: chain broken (previous row removed or altered)"])
        self.attacker.rechain(ids[4])                                   # and every keyed row too
        assert_broken(self, await audit.check(self.store), "differs from the chain head")


class SealerTest(unittest.TestCase):
    def test_the_fast_sealer_writes_what_the_json_encoder_writes(self):
        """The value is documented as an HMAC over compact ASCII JSON: the hand-written encoding must
        be that text for every kind of value a row holds."""
        key = os.urandom(32)
        for link in [(1, -5, "e", None, None, None, None, None, None, None, None, None, None, None, ""),
                     (2**62, 1700000000123456, 'q"\\\n\t\u2028', "北京", "😀", '{"a": [1, 2.5, null]}', "high",
                      str(uuid.uuid4()), "approved", -1, 0, 2**40, True, "\x7f\x01", "k1:ab"),
                     (3, 0, "x", "", "", "", "", "", "", 2**31, 7, 0, False, "", "abc")]:
            text = json.dumps(["v1", *link], ensure_ascii=True, separators=(",", ":"))
            self.assertEqual(Sealer(key).link(link), "k1:" + hmac.digest(key, text.encode(), "sha256").hex())
        long_key = os.urandom(100)
        self.assertEqual(Sealer(long_key).mac("x"), "k1:" + hmac.digest(long_key, b"x", "sha256").hex())


class PruneTest(ChainTestCase):
    """`audit.prune` (`ias audit --prune-before`) from the attacker's side: what remains still
    verifies, and deleting more, or forging the checkpoint without the key, is caught."""

    async def pruned(self, old: int = 6, new: int = 4) -> list[int]:
        """`old` rows, then `new` rows; the old ones pruned. The ids of all of them."""
        ids = await self.write(old)
        [[cut]] = self.sql("SELECT clock_timestamp()")
        ids += (await self.write(new))[old:]
        verdict, pruned = await audit.prune(self.store, cut)
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual((pruned.count, pruned.last_id, pruned.total), (old, ids[old - 1], old))
        return ids

    async def test_a_pruned_log_still_verifies_from_its_checkpoint(self):
        ids = await self.pruned()
        self.assertEqual(self.attacker.ids()[:4], ids[6:])
        [note] = self.attacker.run("SELECT detail FROM audit_log WHERE event = 'audit_pruned'")
        self.assertIn(f"6 rows removed, up to row {ids[5]}", note["detail"])
        verdict = await self.check()
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual((verdict.rows, verdict.pruned, verdict.checkpoint), (5, 6, ids[5]))
        self.assertIn(f"6 older rows pruned, checkpoint at row {ids[5]}", verdict.summary())
        self.assertEqual(read_head(self.chain.head).id, max(self.attacker.ids()))     # the audit_pruned row

    async def test_pruning_again_moves_the_checkpoint_and_counts_on(self):
        ids = await self.pruned()
        [[cut]] = self.sql("SELECT clock_timestamp()")
        await self.write(1)
        verdict, pruned = await audit.prune(self.store, cut)
        self.assertEqual((pruned.count, pruned.total), (5, 11))       # four rows and the first audit_pruned
        verdict = await self.check()
        self.assertTrue(verdict.intact, verdict.problems)
        self.assertEqual((verdict.pruned, verdict.rows), (11, 2))
        self.assertNotIn(ids[-1], self.attacker.ids())

    async def test_the_whole_log_pruned_leaves_its_own_row_and_verifies(self):
        await self.write(3)
        [[now]] = self.sql("SELECT clock_timestamp()")
        await audit.prune(self.store, now)
        self.assertEqual(len(self.attacker.ids()), 1)
        verdict = await self.check()
        self.assertTrue(verdict.intact, verdict.problems)
        await self.write(2)
        self.assertTrue((await self.check()).intact)

    async def test_one_more_old_row_deleted_after_a_prune_is_caught(self):
        ids = await self.pruned()
        self.attacker.run("DELETE FROM audit_log WHERE id = %s", (ids[6],))
        self.assert_broken(await self.check(), f"row {ids[7]}: chain broken")

    async def test_a_checkpoint_moved_without_the_key_is_caught(self):
        """Rows deleted past the cut and the checkpoint moved to cover them: its seal, made with
        another key (or copied from the old checkpoint), does not match."""
        ids = await self.pruned()
        self.attacker.run("DELETE FROM audit_log WHERE id <= %s", (ids[7],))
        value = self.attacker.run("SELECT prev_hash FROM audit_log WHERE id = %s", (ids[8],))[0]["prev_hash"]
        for forged in (mark(os.urandom(32), ids[7], value, 8),
                       self.attacker.run("SELECT seal FROM audit_checkpoint")[0]["seal"]):
            self.attacker.run("UPDATE audit_checkpoint SET last_id = %s, last_value = %s, pruned = 8, seal = %s",
                              (ids[7], value, forged))
            self.assert_broken(await self.check(), "does not match its keyed seal")

    async def test_a_checkpoint_removed_is_caught(self):
        ids = await self.pruned()
        self.attacker.run("DELETE FROM audit_checkpoint")
        self.assert_broken(await self.check(), f"row {ids[6]}: chain broken")

    async def test_old_rows_put_back_before_the_checkpoint_are_caught(self):
        ids = await self.pruned()
        self.attacker.run("INSERT INTO audit_log (id, event, prev_hash, hash) VALUES (%s, 'x', '', '')", (ids[0],))
        self.assert_broken(await self.check(), f"row {ids[0]}: at or before the checkpoint")

    async def test_a_broken_log_is_not_pruned(self):
        ids = await self.write(4)
        self.attacker.run("UPDATE audit_log SET exit_code = 9 WHERE id = %s", (ids[1],))
        [[now]] = self.sql("SELECT clock_timestamp()")
        verdict, pruned = await audit.prune(self.store, now)
        self.assertIsNone(pruned)
        self.assertFalse(verdict.intact)
        self.assertEqual(self.attacker.ids(), ids)

    async def test_the_append_only_trigger_is_back_after_a_prune(self):
        ids = await self.pruned()
        with self.assertRaises(psycopg.errors.InsufficientPrivilege):
            self.attacker.conn.execute("DELETE FROM audit_log WHERE id = %s", (ids[-1],))

    async def test_a_call_in_flight_and_what_follows_it_are_kept(self):
        await self.write(2)
        await self.store.audit(AuditEntry("skill_started", skill_name="slow", detail="call=" + "a" * 32 + " pid=1 start=1"))
        [started] = self.attacker.ids()[-1:]
        await self.write(2)
        [[now]] = self.sql("SELECT clock_timestamp()")
        _, pruned = await audit.prune(self.store, now)
        self.assertEqual(pruned.count, 2)
        self.assertEqual(self.attacker.ids()[0], started)
        self.assertEqual([row.id for row in await self.store.unfinished_calls()], [started])
        self.assertTrue((await self.check()).intact)


@slow
class CommandTest(unittest.IsolatedAsyncioTestCase):
    """`ias run` writes keyed rows; `ias audit --verify` (a real process) finds the attacks."""

    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.addCleanup(drop_schema, self.schema_name)
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-audit-"))
        self.addCleanup(subprocess.run, ["rm", "-rf", str(self.tmp)])
        self.env = {**os.environ, "IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp),
                    "IAS_SKILLS_DIR": str(FIXTURES / "gate")}
        self.env.pop("IAS_CONFIG", None)
        self.attacker = Attacker(self.dsn)
        self.addCleanup(self.attacker.close)

    def ias(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              env=self.env, cwd=self.tmp, timeout=60, stdin=subprocess.DEVNULL)

    def now(self) -> str:
        """The database's clock as an ISO time."""
        return self.attacker.conn.execute("SELECT clock_timestamp() AS now").fetchone()["now"].isoformat()

    async def write_rows(self) -> list[int]:
        """Two calls through `ias run`, then rows from a store keyed as the commands key theirs."""
        for text in ("a", "b"):
            self.assertEqual(self.ias("run", "echo_low", json.dumps({"text": text})).returncode, 0)
        chain = AuditChain.derive(load_key(self.tmp / "secret.key"), self.tmp / "audit.head")
        store = await Store.open(self.dsn, chain=chain)
        try:
            for i in range(3):
                await store.audit(AuditEntry("skill_finished", exit_code=i))
        finally:
            await store.close()
        verify = self.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertEqual(verify.stdout, "audit log: chain intact (7 rows)\n")
        return self.attacker.ids()

    async def test_an_edited_and_rechained_log_fails_verify(self):
        ids = await self.write_rows()
        self.assertTrue(all(row["hash"].startswith("k1:") for row in self.attacker.conn.execute("SELECT hash FROM audit_log")))
        self.attacker.run("UPDATE audit_log SET exit_code = 0 WHERE id = %s", (ids[2],))
        self.attacker.rechain(ids[2])
        verify = self.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 1, verify.stdout)
        self.assertIn(f"row {ids[2]}: not keyed", verify.stdout)
        self.assertIn(f"row {ids[-1]}: differs from the chain head", verify.stdout)
        self.assertRegex(verify.stderr, r"^audit log: chain broken \(\d+ problems\)\n$")

    async def test_a_truncated_log_fails_verify(self):
        ids = await self.write_rows()
        self.attacker.run("DELETE FROM audit_log WHERE id > %s", (ids[-4],))
        verify = self.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 1, verify.stdout)
        self.assertIn(f"row {ids[-1]} is missing", verify.stdout)

    async def test_prune_before_a_date_keeps_the_rest_verifiable(self):
        await self.write_rows()
        self.assertEqual(self.ias("audit", "--prune-before", "2000-01-01").stdout,
                         "audit log: no row older than 2000-01-01T00:00:00+08:00; nothing pruned\n")
        future = self.ias("audit", "--prune-before", "2999-01-01")
        self.assertEqual(future.returncode, 2)
        self.assertIn("is in the future", future.stderr)
        pruned = self.ias("audit", "--prune-before", self.now())
        self.assertEqual(pruned.returncode, 0, pruned.stderr)
        self.assertRegex(pruned.stdout, r"^audit log: 7 rows older than .* removed \(up to row \d+\); a keyed "
                                        r"checkpoint keeps the rest verifiable \(7 rows pruned in all\)\n$")
        verify = self.ias("audit", "--verify")
        self.assertEqual((verify.returncode, verify.stdout), (0, f"audit log: chain intact (1 rows; 7 older rows "
                                                                f"pruned, checkpoint at row {pruned.stdout.split('row ')[1].split(')')[0]})\n"))

    async def test_a_broken_log_is_not_pruned_by_the_command(self):
        ids = await self.write_rows()
        self.attacker.run("DELETE FROM audit_log WHERE id = %s", (ids[3],))
        pruned = self.ias("audit", "--prune-before", self.now())
        self.assertEqual(pruned.returncode, 1)
        self.assertIn("nothing pruned", pruned.stderr)
        self.assertEqual(len(self.attacker.ids()), 6)


if __name__ == "__main__":
    unittest.main()


@slow
class InHelpers:
    """The same checks with the log cut into three spans, the last two walked by helper processes (as a
    long log is on a machine with several CPUs): every break is found across the span boundaries too."""

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        for name, value in (("VERIFY_SPAN_MIN", 1), ("VERIFY_PARTS", 3)):
            patch = mock.patch.object(audit, name, value)
            patch.start()
            self.addCleanup(patch.stop)


class KeyedChainInHelpersTest(InHelpers, KeyedChainTest):
    async def test_a_helper_that_fails_is_a_break(self):
        await self.write(6)
        with mock.patch.object(audit.sys, "executable", "/bin/false"):
            self.assert_broken(await self.check(), "could not be checked: the helper process failed (exit 1")

    async def test_the_spans_cover_the_log(self):
        self.assertEqual(audit.spans(None, None, 3), [])
        self.assertEqual(audit.spans(5, 5, 3), [(5, 5)])
        self.assertEqual(audit.spans(1, 10, 3), [(1, 4), (5, 8), (9, 10)])
        with mock.patch.object(audit, "VERIFY_SPAN_MIN", 4):
            self.assertEqual(audit.spans(1, 10, 3), [(1, 5), (6, 10)])


class UnkeyedRowsInHelpersTest(InHelpers, UnkeyedRowsTest):
    pass


class PruneInHelpersTest(InHelpers, PruneTest):
    pass

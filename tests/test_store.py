"""Every value survives the store: NUL, lone surrogates, NaN/Infinity and deep nesting, on every write path;
and the approval transitions, written from plain values, are compare-and-set with their audit rows.

Against the real PostgreSQL of the test run; the rule itself is in ias/store/values.py's docstring.
"""
import asyncio
import json
import math
import shutil
import tempfile
import unittest
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from unittest import mock

import psycopg

from ias.clock import TZ
from ias.confirmation import canonical
from ias.audit import verify
from ias.errors import StoreError
from ias.inbox import Inbox
from ias.limits import STORED_JSON_DEPTH
from ias.scheduler import prune_daily
from ias.store import TOO_DEEP, Approval, AuditEntry, Store, storable
from ias.supervisor import Supervisor
from tests.servers.llm import calls, text
from tests.support import REPO, FakeOwner, GateTestCase, StoreTestCase
from tests.test_agent import WireTestCase

NUL = "a\x00b"
SURROGATE = "c\ud800d"                    # as from the JSON text "c\ud800d"
ESCAPED = "e\udcffe"                      # invalid UTF-8 argv decoded with surrogateescape
BAD_TEXTS = {NUL: "a\ufffdb", SURROGATE: "c\ufffdd", ESCAPED: "e\ufffde"}


def nested(depth: int):
    """A list nested `depth` deep, innermost holding 1 (built without recursion)."""
    value = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def depth_of(value) -> tuple[int, object]:
    """(levels of single-element lists, what the innermost one holds)."""
    levels = 0
    while isinstance(value, list) and len(value) == 1:
        value, levels = value[0], levels + 1
    return levels, value


def hostile() -> dict:
    """A JSON value holding everything PostgreSQL refuses as such."""
    return {"nul": NUL, "surrogate": SURROGATE, "escaped": ESCAPED, "nan": math.nan, "inf": math.inf,
            "-inf": -math.inf, "key\x00": 1, "list": [NUL, math.nan, {"x\ud800": ESCAPED}],
            "deep": nested(5_000), "fine": "普通 text", "number": 1.5}


def assert_sanitised(test: unittest.TestCase, stored: dict, depth_offset: int = 1) -> None:
    """`stored` is hostile() after the store's rule (its top level `depth_offset` deep in the document)."""
    deep = stored.pop("deep")
    test.assertEqual(stored, {"nul": "a\ufffdb", "surrogate": "c\ufffdd", "escaped": "e\ufffde", "nan": "NaN",
                              "inf": "Infinity", "-inf": "-Infinity", "key\ufffd": 1,
                              "list": ["a\ufffdb", "NaN", {"x\ufffd": "e\ufffde"}], "fine": "普通 text",
                              "number": 1.5})
    test.assertEqual(depth_of(deep), (STORED_JSON_DEPTH - depth_offset, TOO_DEEP))


class StorableTest(unittest.TestCase):
    def test_text(self):
        for bad, good in BAD_TEXTS.items():
            self.assertEqual(storable(bad), good)
        self.assertEqual(storable("ok \U0001f600"), "ok \U0001f600")
        self.assertEqual(storable("\ud83d\ude00"), "\U0001f600")       # a valid pair is the character it encodes
        self.assertEqual(storable("\ude00\ud83d"), "\ufffd\ufffd")

    def test_numbers(self):
        self.assertEqual(storable([math.nan, math.inf, -math.inf, 0.5, 7, True, None]),
                         ["NaN", "Infinity", "-Infinity", 0.5, 7, True, None])

    def test_keys_that_become_equal_keep_the_last_value(self):
        self.assertEqual(storable({"k\x00": 1, "k\ud800": 2}), {"k\ufffd": 2})

    def test_the_original_is_untouched(self):
        value = hostile()
        storable(value)
        self.assertEqual(value["nul"], NUL)
        self.assertTrue(math.isnan(value["nan"]))

    def test_deep_nesting_never_recurses(self):
        for depth in (STORED_JSON_DEPTH, STORED_JSON_DEPTH + 1, 100_000):
            stored = storable(nested(depth))
            json.dumps(stored)                                # and the result can be serialised
            if depth <= STORED_JSON_DEPTH:
                self.assertEqual(depth_of(stored), (depth, 1))
            else:
                self.assertEqual(depth_of(stored), (STORED_JSON_DEPTH, TOO_DEEP))


class WritePathsTest(StoreTestCase):
    """Each store method that writes user-controlled text or JSON, with every kind of hostile value."""

    async def test_audit(self):
        for bad, good in BAD_TEXTS.items():
            await self.store.audit(AuditEntry(f"event {bad}", user_id=bad, skill_name=bad, params=hostile(),
                                              decision=bad, detail=bad))
        rows = await self.store.audit_rows()
        self.assertEqual(len(rows), 3)
        for row, good in zip(rows, BAD_TEXTS.values()):
            self.assertEqual((row.event, row.user_id, row.skill_name, row.decision, row.detail),
                             (f"event {good}", good, good, good, good))
            assert_sanitised(self, row.params)
        self.assertEqual(await verify(self.store), [])

    async def test_messages(self):
        for bad, good in BAD_TEXTS.items():
            await self.store.append_messages(bad, [{"role": "user", "content": bad},
                                                   {"role": "tool", "content": hostile()}])
            # The same (unstorable) user id finds its history again.
            user, tool = await self.store.recent_messages(bad, 10)
            self.assertEqual(user, {"role": "user", "content": good})
            assert_sanitised(self, tool["content"], depth_offset=2)
            self.assertEqual(await self.store.clear_messages(bad), 2)

    async def test_channel_state_and_seen_messages(self):
        for bad, good in BAD_TEXTS.items():
            await self.store.set_state(bad, bad, hostile())
            assert_sanitised(self, await self.store.get_state(bad, bad))
            await self.store.set_state(bad, bad, math.inf)
            self.assertEqual(await self.store.get_state(bad, bad), "Infinity")
            self.assertTrue(await self.store.mark_seen(bad, bad))
            self.assertFalse(await self.store.mark_seen(bad, bad))      # a redelivery is still recognised
            await self.store.clear_state(bad)
            self.assertIsNone(await self.store.get_state(bad, bad))
        self.assertEqual(set(self.sql("SELECT channel, message_id FROM seen_messages")),
                         {(good, good) for good in BAD_TEXTS.values()})

    async def test_tasks_and_runs(self):
        now = datetime.now(timezone.utc)
        for bad, good in BAD_TEXTS.items():
            task = await self.store.add_task(bad, bad, bad, "reminder", bad, now, now)
            self.assertEqual((task.user_id, task.name, task.schedule, task.text), (good, good, good, good))
            task = await self.store.update_task(task.id, name=bad + "2", schedule=bad, kind="prompt", text=bad * 2,
                                                enabled=True, next_run_at=now)
            self.assertEqual((task.name, task.text), (good + "2", good * 2))
            run_id = await self.store.claim_slot(task.id, now, now + timedelta(hours=1))
            await self.store.finish_run(run_id, "error", reply=bad, error=bad)
            [run] = self.task_runs(task.id)
            self.assertEqual((run.status, run.reply, run.error), ("error", good, good))

    async def test_approval_params_and_result(self):
        for bad, good in BAD_TEXTS.items():
            approval_id = uuid.uuid4()
            stored = await self.store.normalised(hostile())
            assert_sanitised(self, dict(stored))
            row = await self.store.create_approval(
                approval_id, bad, bad, stored, 60, "h",
                AuditEntry("approval_requested", user_id=bad, params=hostile(), approval_id=approval_id))
            self.assertEqual((row.user_id, row.skill_name, row.code_hash), (good, good, "h"))
            self.assertEqual(canonical(row.params), canonical(stored))   # what is hashed is what is stored
            assert_sanitised(self, row.params)
            closed = await self.store.close_approval(approval_id, "expired", AuditEntry("approval_expired", detail=bad))
            self.assertEqual(closed.status, "expired")
            await self.store.record_result(approval_id, {"success": True, "output": bad, "extra": hostile()})
            result = (await self.store.approval(approval_id)).result
            self.assertEqual(result["output"], good)
            assert_sanitised(self, result["extra"], depth_offset=2)
        self.assertEqual(await verify(self.store), [])


class PoolTest(StoreTestCase):
    async def test_unused_connections_are_closed_and_reopened_on_demand(self):
        with mock.patch("ias.store.pool.POOL_IDLE_CLOSE", 0.05):
            await self.store.audit(AuditEntry("pool_test"))
            self.assertEqual(self.store.idle_connections, 1)
            for _ in range(200):                      # the timer fires 0.05 s after the connection came back
                if self.store.idle_connections == 0:
                    break
                await asyncio.sleep(0.01)
            self.assertEqual(self.store.idle_connections, 0)
            [row] = await self.store.audit_rows(1)     # a new connection when one is needed again
            self.assertEqual(row.event, "pool_test")

    async def test_idle_connections_close_under_the_given_supervisor_and_a_failed_close_stops_nothing(self):
        supervisor = Supervisor(daemon=True)
        store = await Store.open(self.dsn, chain=self.chain, supervisor=supervisor)
        self.addAsyncCleanup(store.close)
        closes = supervisor.scope("store")
        with mock.patch("ias.store.pool.POOL_IDLE_CLOSE", 0.05):
            await store.audit(AuditEntry("pool_test"))
            [(conn, _)] = store._idle
            real_close, closing = conn.close, asyncio.Event()

            async def refused():
                closing.set()
                await real_close()
                raise psycopg.OperationalError("the server went away first")
            conn.close = refused
            with self.assertLogs("ias.store.pool", "WARNING") as logged:
                await asyncio.wait_for(closing.wait(), 5)
                self.assertTrue(await closes.wait(5))
        self.assertIn("the server went away first", logged.output[0])
        self.assertEqual(store.idle_connections, 0)
        self.assertFalse(supervisor.failed.is_set())
        [row] = await store.audit_rows(1)
        self.assertEqual(row.event, "pool_test")


class ApprovalTransitionsTest(StoreTestCase):
    """The approval rows' transitions from plain values: each one compare-and-set, committed with its audit row."""

    async def pending(self, user_id: str = "owner", timeout: float = 60) -> Approval:
        approval_id = uuid.uuid4()
        params = await self.store.normalised({"note": "hi", "n": 1e16})
        return await self.store.create_approval(
            approval_id, user_id, "mark_high", params, timeout, "v1:h",
            AuditEntry("approval_requested", user_id=user_id, skill_name="mark_high", params=params,
                       risk="high", approval_id=approval_id, decision="pending"))

    @staticmethod
    def entry(row: Approval, decision: str, detail: str | None = None) -> AuditEntry:
        return AuditEntry(f"approval_{decision}", user_id=row.user_id, skill_name=row.skill_name, params=row.params,
                          risk="high", approval_id=row.id, decision=decision, detail=detail)

    async def events(self) -> list[tuple]:
        return [(r.event, r.decision, r.detail) for r in await self.store.audit_rows()]

    async def test_normalised_is_what_a_jsonb_column_holds(self):
        value = {"big": 1e16, "small": 1.5e-7, "zero": -0.0, "one": 1.0, "huge": 10 ** 30, "max": 1.7976931348623157e308,
                 "list": [1, 2.0, True, None, "x"], "B": 2, "a": 1}
        stored = await self.store.normalised(value)
        # jsonb rewrites numbers, so a hash over the call's own params would not verify.
        self.assertNotEqual(canonical(stored), canonical(value))
        self.assertEqual((stored["big"], type(stored["big"]), stored["zero"]), (10 ** 16, int, 0.0))
        self.assertEqual(canonical(await self.store.normalised(stored)), canonical(stored))    # a fixed point
        row = await self.store.create_approval(uuid.uuid4(), "owner", "s", stored, 60, "v1:h", AuditEntry("e"))
        self.assertEqual(canonical(row.params), canonical(stored))
        self.assertEqual(canonical((await self.store.approval(row.id)).params), canonical(stored))

    async def test_create_writes_the_row_and_its_audit_row_together(self):
        row = await self.pending()
        self.assertEqual((row.status, row.attempts_left, row.code_hash), ("pending", 3, "v1:h"))
        [audited] = await self.store.audit_rows()
        self.assertEqual((audited.event, audited.approval_id, audited.params), ("approval_requested", row.id, row.params))
        with self.assertRaises(StoreError):                       # one pending approval per user
            await self.pending()
        with self.assertRaises(psycopg.errors.InvalidTextRepresentation):
            await self.store.create_approval(uuid.uuid4(), "other", "s", {}, 60, "v1:h",
                                             AuditEntry("approval_requested", approval_id="not-a-uuid"))
        self.assertEqual([a.user_id for a in await self.store.approvals(limit=None)], ["owner"])   # rolled back
        self.assertEqual(len(await self.store.audit_rows()), 1)

    async def test_sixteen_concurrent_approvals_have_one_winner(self):
        row = await self.pending()
        won = await asyncio.gather(*(self.store.approve(row, row.code_hash, self.entry(row, "approved"))
                                     for _ in range(16)))
        [winner] = [w for w in won if w is not None]
        self.assertEqual((winner.status, winner.attempts_left), ("approved", 3))
        self.assertIsNotNone(winner.consumed_at)
        self.assertEqual((await self.events())[1:], [("approval_approved", "approved", None)])
        self.assertEqual(await verify(self.store), [])

    async def test_ten_concurrent_wrong_codes_spend_exactly_three_attempts(self):
        row = await self.pending()
        spent = await asyncio.gather(*(self.store.spend_attempt(row, self.entry(row, "wrong_code", "wrong code"))
                                       for _ in range(10)))
        spent = sorted((s for s in spent if s is not None), key=lambda s: -s.attempts_left)
        self.assertEqual([(s.attempts_left, s.status) for s in spent], [(2, "pending"), (1, "pending"), (0, "rejected")])
        self.assertIsNotNone(spent[-1].consumed_at)
        # The SQL decided the last attempt rejects; its audit row says so, the rest of the entry as given.
        self.assertEqual((await self.events())[1:], [("approval_wrong_code", "wrong_code", "wrong code")] * 2
                         + [("approval_rejected", "rejected", "wrong code")])
        rejected = (await self.store.audit_rows())[-1]
        self.assertEqual((rejected.user_id, rejected.approval_id, rejected.risk), ("owner", row.id, "high"))
        self.assertIsNone(await self.store.approve(row, row.code_hash, self.entry(row, "approved")))
        self.assertEqual(await verify(self.store), [])

    async def test_transitions_are_bound_to_the_user_and_the_expiry(self):
        row = await self.pending()
        mallory = replace(row, user_id="mallory")
        self.assertIsNone(await self.store.approve(mallory, row.code_hash, self.entry(row, "approved")))
        self.assertIsNone(await self.store.spend_attempt(mallory, self.entry(row, "wrong_code")))
        self.assertEqual((await self.store.approval(row.id)).attempts_left, 3)
        old = await self.pending("late", timeout=0)               # expires as it is created
        self.assertIsNone(await self.store.approve(old, old.code_hash, self.entry(old, "approved")))
        self.assertIsNone(await self.store.spend_attempt(old, self.entry(old, "wrong_code")))
        closed = await self.store.close_approval(old.id, "expired", self.entry(old, "expired", "timeout"))
        self.assertEqual(closed.status, "expired")
        self.assertIsNone(await self.store.close_approval(old.id, "rejected", self.entry(old, "rejected", "cancel")))
        self.assertEqual((await self.events())[2:], [("approval_expired", "expired", "timeout")])   # one per transition made

    async def test_transitions_are_bound_to_the_rendered_row(self):
        """Each transition matches only while the row holds the daemon's copy: skill, params, HMAC."""
        row = await self.pending()
        for other in (replace(row, skill_name="mark_low"), replace(row, code_hash="v1:other"),
                      replace(row, params={**row.params, "note": "evil"})):
            self.assertIsNone(await self.store.approve(other, other.code_hash, self.entry(row, "approved")))
            self.assertIsNone(await self.store.spend_attempt(other, self.entry(row, "wrong_code")))
            self.assertIsNone(await self.store.close_approval(row.id, "rejected", self.entry(row, "rejected"), other))
        self.assertIsNone(await self.store.approve(row, "v1:wrong code", self.entry(row, "approved")))
        self.sql("UPDATE pending_approvals SET params = jsonb_set(params, '{n}', '10000000000000000.0')")
        self.assertIsNone(await self.store.approve(row, row.code_hash, self.entry(row, "approved")))   # equal, not the same
        self.sql("UPDATE pending_approvals SET params = jsonb_set(params, '{n}', '10000000000000000')")
        after = await self.store.approval(row.id)
        self.assertEqual((after.status, after.attempts_left), ("pending", 3))
        self.assertEqual(len(await self.store.audit_rows()), 1)
        self.assertEqual((await self.store.approve(row, row.code_hash, self.entry(row, "approved"))).status, "approved")

    async def test_a_tampered_approval_is_closed_with_its_audit_row(self):
        row = await self.pending()
        self.sql("UPDATE pending_approvals SET status = 'approved'")
        await self.store.close_tampered(row.id, self.entry(row, "tampered", "status approved set by another writer"))
        self.assertEqual((await self.store.approval(row.id)).status, "expired")
        self.assertEqual((await self.events())[-1], ("approval_tampered", "tampered", "status approved set by another writer"))
        await self.store.close_tampered(uuid.uuid4(), self.entry(row, "tampered", "row deleted"))     # no row: audited
        self.assertEqual((await self.events())[-1], ("approval_tampered", "tampered", "row deleted"))
        self.assertEqual(await verify(self.store), [])

    async def test_a_refused_audit_row_undoes_the_transition(self):
        row = await self.pending()
        junk = AuditEntry("approval_approved", approval_id="not-a-uuid")
        for transition in (self.store.approve(row, row.code_hash, junk), self.store.spend_attempt(row, junk),
                           self.store.close_approval(row.id, "rejected", junk)):
            with self.assertRaises(psycopg.errors.InvalidTextRepresentation):
                await transition
        after = await self.store.approval(row.id)
        self.assertEqual((after.status, after.attempts_left, after.consumed_at), ("pending", 3, None))
        self.assertEqual(len(await self.store.audit_rows()), 1)
        self.assertEqual((await self.store.approve(row, row.code_hash, self.entry(row, "approved"))).status, "approved")


class RetentionTest(StoreTestCase):
    """What is older than IAS_RETENTION_DAYS goes, daily; what is still pending stays."""

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.now = datetime.now(timezone.utc)
        self.old = self.now - timedelta(days=200)

    async def outbox(self, state: str, at: datetime, task_run_id: int | None = None) -> int:
        [row] = await self.store.enqueue("owner", "console", "task" if task_run_id else "reply",
                                         [("hi", uuid.uuid4().hex)], at, at, task_run_id=task_run_id)
        if state != "queued":
            await self.store.settle([row.id], state, at)
        return row.id

    def run_row(self, task_id: int, slot: datetime, status: str = "ok", delivery: str | None = "delivered") -> int:
        [[run_id]] = self.sql("INSERT INTO task_runs (task_id, slot, started_at, finished_at, status, delivery) "
                              "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                              (task_id, slot, slot, None if status == "running" else slot, status, delivery))
        return run_id

    async def test_old_settled_history_is_removed_and_pending_kept(self):
        await self.store.append_messages("owner", [{"role": "user", "content": "old"}])
        self.sql("UPDATE messages SET at = %s", (self.old,))
        await self.store.append_messages("owner", [{"role": "user", "content": "new"}])
        sent_old, queued_old, expired_old = [await self.outbox(state, self.old) for state in ("sent", "queued", "expired")]
        sent_new = await self.outbox("sent", self.now)
        task = await self.store.add_task("owner", "t", "every 1h", "reminder", "x", None, self.old)
        slots = [self.old + timedelta(hours=i) for i in range(5)]
        done, running, undelivered, waiting, newest = (
            self.run_row(task.id, slots[0]), self.run_row(task.id, slots[1], "running", None),
            self.run_row(task.id, slots[2], delivery="queued"), self.run_row(task.id, slots[3]),
            self.run_row(task.id, slots[4]))
        queued_for_run = await self.outbox("queued", self.old, task_run_id=waiting)
        handled_old, pending_old, handled_new = [await self.store.record_inbound("wechat", "owner", None, text)
                                                 for text in ("handled", "pending", "new")]
        for inbound_id in (handled_old, handled_new):
            await self.store.finish_inbound(inbound_id)
        self.sql("UPDATE inbound SET received_at = %s, done_at = %s WHERE id <> %s", (self.old, self.old, handled_new))
        self.sql("UPDATE inbound SET done_at = NULL WHERE id = %s", (pending_old,))
        for day in (self.old.date(), self.now.date()):
            await self.store.record_usage(day, "owner", "m", 10, 1, False)
        self.sql("UPDATE token_usage SET updated_at = %s WHERE day = %s", (self.old, self.old.date()))

        removed = await self.store.prune_history(self.now - timedelta(days=180), batch=1)
        self.assertEqual(removed, {"messages": 1, "outbox": 2, "task_runs": 1, "inbound": 1, "token_usage": 1})
        self.assertEqual([r[0] for r in self.sql("SELECT text FROM inbound ORDER BY id")], ["pending", "new"])
        self.assertEqual([m["content"] for m in await self.store.recent_messages("owner", 10)], ["new"])
        self.assertEqual(sorted(r[0] for r in self.sql("SELECT id FROM outbox")),
                         sorted([queued_old, sent_new, queued_for_run]))
        self.assertNotIn(sent_old, [r[0] for r in self.sql("SELECT id FROM outbox")])
        self.assertNotIn(expired_old, [r[0] for r in self.sql("SELECT id FROM outbox")])
        self.assertEqual(sorted(run.id for run in self.task_runs(task.id)), [running, undelivered, waiting, newest])
        self.assertNotIn(done, [run.id for run in self.task_runs(task.id)])
        self.assertEqual(self.sql("SELECT day FROM token_usage"), [(self.now.date(),)])
        self.assertEqual(await self.store.prune_history(self.now - timedelta(days=180)),
                         {"messages": 0, "outbox": 0, "task_runs": 0, "inbound": 0, "token_usage": 0})

    async def test_the_daemon_job_prunes_at_start_then_daily_on_its_clock(self):
        clock = [self.now]
        slept: asyncio.Queue[float] = asyncio.Queue()
        wake: asyncio.Queue[None] = asyncio.Queue()

        async def sleep(seconds: float) -> None:
            await slept.put(seconds)
            await wake.get()
        await self.store.append_messages("owner", [{"role": "user", "content": "ancient"}])
        self.sql("UPDATE messages SET at = %s", (self.old,))
        root = Path(tempfile.mkdtemp(prefix="ias-inbox-"))
        self.addCleanup(shutil.rmtree, root, True)
        local = self.now.astimezone(TZ)     # the inbox names its days by the Beijing date
        old_day, kept_day = ((local - timedelta(days=n)).strftime("%Y-%m-%d") for n in (181, 179))
        for day in (old_day, kept_day, "notes"):
            (root / day).mkdir()
            (root / day / "093000-abcdef-image.png").write_bytes(b"x")
        job = asyncio.create_task(prune_daily(self.store, 180, now=lambda: clock[0], sleep=sleep,
                                              inbox=Inbox(root, 10 ** 9)))
        self.addCleanup(job.cancel)
        self.assertEqual(await asyncio.wait_for(slept.get(), 10), 86400)
        self.assertEqual(self.sql("SELECT count(*) FROM messages"), [(0,)])
        self.assertEqual(sorted(p.name for p in root.iterdir()), sorted([kept_day, "notes"]))
        await self.store.append_messages("owner", [{"role": "user", "content": "179 days old"}])
        self.sql("UPDATE messages SET at = %s", (self.now - timedelta(days=179),))
        clock[0] += timedelta(days=1)
        wake.put_nowait(None)
        await asyncio.wait_for(slept.get(), 10)
        self.assertEqual(self.sql("SELECT count(*) FROM messages"), [(1,)])
        clock[0] += timedelta(days=1)
        wake.put_nowait(None)
        await asyncio.wait_for(slept.get(), 10)
        self.assertEqual(self.sql("SELECT count(*) FROM messages"), [(0,)])

    async def test_calls_in_flight_are_found_without_the_log(self):
        """unfinished_calls reads the calls in flight a trigger keeps as rows are appended, not the log."""
        tags = [f"call={i:032x} pid=1 start=1" for i in range(3)]
        for tag in tags:
            await self.store.audit(AuditEntry("skill_started", skill_name="s", detail=tag))
        await self.store.audit(AuditEntry("skill_finished", skill_name="s", detail=tags[0]))
        await self.store.audit(AuditEntry("skill_interrupted", skill_name="s", detail=tags[2]))
        await self.store.audit(AuditEntry("skill_started", skill_name="s", detail="not a call tag"))
        self.assertEqual([row.detail for row in await self.store.unfinished_calls()], [tags[1]])
        self.assertEqual(self.sql("SELECT call FROM calls_in_flight"), [(tags[1],)])


class ConnectTest(unittest.IsolatedAsyncioTestCase):
    async def test_a_junk_dsn_is_a_store_error(self):
        for dsn in ("junk", "postgresql://[::1", "postgresql://u@/db?nonsense=1", "host=/tmp/\udcff"):
            with self.assertRaises(StoreError) as caught:
                await Store.open(dsn)
            self.assertEqual(len(str(caught.exception).splitlines()), 1, caught.exception)


class ApprovalCodeTest(GateTestCase):
    async def test_the_right_code_works_for_unstorable_params(self):
        """The HMAC is over the params as stored, so the code the owner got still verifies."""
        skill = self.registry.get("mark_high")
        params = {"marker": NUL, "note": SURROGATE, "api_token": ESCAPED, "n": math.nan, "i": -math.inf}
        waiting = asyncio.create_task(self.approvals.request("owner", skill, params, self.owner.notify))
        code = await self.owner.code()
        self.assertIn("· marker：a\\u{fffd}b ⚠️含特殊字符\n", self.owner.messages[-1])   # what will be stored and run
        self.assertEqual(await self.approvals.redeem("owner", code), "已确认，正在执行：mark_high")
        outcome = await waiting
        self.assertEqual(outcome.status, "approved")
        self.assertEqual(outcome.approval.params, {"marker": "a\ufffdb", "note": "c\ufffdd", "api_token": "e\ufffde",
                                                   "n": "NaN", "i": "-Infinity"})
        self.assertEqual(await verify(self.store), [])


class ApprovedOutputTest(GateTestCase):
    """An approved High call whose output holds NUL bytes: run once, result recorded, chain intact."""
    system_skills = REPO / "resources" / "skills"

    async def test_nul_output(self):
        command = "head -c3 /dev/zero; printf 'x\\0y'"
        call = asyncio.create_task(self.gate.call("owner", "execute_shell", {"command": command}, self.owner.notify))
        self.assertEqual(await self.approvals.redeem("owner", await self.owner.code()), "已确认，正在执行：execute_shell")
        result = await call
        # The model sees the output as it was.
        self.assertTrue(result["success"], result)
        self.assertEqual(result["stdout"], "\x00\x00\x00x\x00y")
        self.assertEqual(result["exit_code"], 0)
        [(stored, status)] = self.sql("SELECT result, status FROM pending_approvals")
        self.assertEqual(status, "approved")
        self.assertEqual(stored["stdout"], "\ufffd\ufffd\ufffdx\ufffdy")
        events = [row.event for row in await self.store.audit_rows()]
        self.assertEqual(events, ["approval_requested", "approval_approved", "skill_started", "skill_finished"])
        self.assertEqual(await verify(self.store), [])


class SkillOutputTest(GateTestCase):
    async def test_deeply_nested_json_output(self):
        """Output that looks like JSON but is nested too deeply to parse reaches the model as text."""
        deep = "[" * 5_000 + "]" * 5_000             # past Python's recursion limit, within the model's share
        self.assertEqual(await self.gate.call("owner", "echo_low", {"text": deep}), {"success": True, "output": deep})
        events = [row.event for row in await self.store.audit_rows()]
        self.assertEqual(events, ["skill_started", "skill_finished"])


class TurnTest(WireTestCase):
    """Whole turns whose tool arguments, tool output and model reply hold unstorable values (as the wire brings
    them: lone surrogates in JSON escapes)."""

    async def test_the_turn_is_kept_and_the_owner_answered(self):
        owner = FakeOwner()
        arguments = '{"command": "printf \'a\\\\0b\'", "n": 1, "s": "\\ud800\\u0000"}'
        self.server.script(calls(("execute_shell", arguments), ("execute_shell", {"command": "printf 'a\\0b'"})),
                           text("完成\u0000\ud800"))
        turn = asyncio.create_task(self.agent.turn("owner", "运行 \udcff", owner.notify))
        self.assertEqual(await self.approvals.redeem("owner", await owner.code()), "已确认，正在执行：execute_shell")
        self.assertEqual(await turn, "完成\x00\ufffd")           # the owner gets the model's reply, valid Unicode
        invalid, ran = [json.loads(m["content"]) for m in self.tool_messages()]
        self.assertTrue(invalid["error"].startswith("参数错误："), invalid)
        self.assertEqual(ran["stdout"], "a\x00b")                   # the model saw the real output
        history = await self.store.recent_messages("owner", 50)
        self.assertEqual([m["role"] for m in history], ["user", "assistant", "tool", "tool", "assistant"])
        self.assertEqual(history[0]["content"], "运行 \ufffd")
        self.assertEqual(history[-1]["content"], "完成\ufffd\ufffd")
        [(result,)] = self.sql("SELECT result FROM pending_approvals WHERE status = 'approved'")
        self.assertEqual(result["stdout"], "a\ufffdb")
        [(params,)] = self.sql("SELECT params FROM audit_log WHERE event = 'skill_invalid'")
        self.assertEqual((params["n"], params["s"]), (1, "\ufffd\ufffd"))
        self.assertEqual(await verify(self.store), [])


if __name__ == "__main__":
    unittest.main()

"""The gate's finish path: a started run's end is always recorded — cancelled, refused by the store,
or interrupted by a process that died (recorded at the next start). And the bounds on what a call
may bring (SPEC §6.11): arguments past 64 KiB refused on every path, audit params bounded."""
import asyncio
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
import unittest
import uuid
from pathlib import Path
from unittest import mock

from ias.approval import Approvals
from ias.config import Config
from ias.audit import REDACTED, redact
from ias.limits import ARGUMENTS_MAX, AUDIT_KEY_MAX, AUDIT_VALUE_MAX
from ias.gate import NOT_SAVED, Gate
from ias.pgcluster import Cluster
from ias.results import interrupted
from ias.processes import identity
from ias.store import AuditEntry, Store
from ias.unwritten import End
from tests.support import FIXTURES, FakeOwner, GateTestCase, granted, slow, test_chain, until, with_env
from tests.test_runner import running



async def wait_for_text(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never got written")
        await asyncio.sleep(0.02)
    return path.read_text().strip()


class FinishTest(GateTestCase):
    user_skills = FIXTURES / "daemon"

    async def approved_nap(self, gate: Gate, approvals: Approvals, owner: FakeOwner):
        """Start nap_high through `gate`, confirm it, wait until it runs; (task, the host pids of its processes,
        wake file)."""
        pidfile, wake = granted("pid"), granted("wake")
        call = asyncio.create_task(gate.call("owner", "nap_high", {"pidfile": str(pidfile), "wake": str(wake)},
                                             owner.notify))
        self.assertEqual(await approvals.redeem("owner", await owner.code()), "已确认，正在执行：nap_high")
        await wait_for_text(pidfile)
        return call, with_env(f"IAS_PARAM_PIDFILE={pidfile}"), wake

    def finish_rows(self) -> list[tuple]:
        return self.sql("SELECT event, decision, detail FROM audit_log WHERE event LIKE 'skill_%%' ORDER BY id")

    async def test_a_cancelled_turn_still_records_the_end_and_the_result(self):
        call, pids, _ = await self.approved_nap(self.gate, self.approvals, self.owner)
        call.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await call
        self.assertTrue(await self.gate.drain(5))
        await until(lambda: not any(map(running, pids)), 5)      # SIGKILL was sent; its delivery takes a moment
        (started, _, tag), (finished, decision, tag2) = self.finish_rows()
        self.assertEqual((started, finished, decision, tag2), ("skill_started", "skill_finished", "cancelled", tag))
        self.assertEqual(self.sql("SELECT result FROM pending_approvals")[0][0], interrupted("nap_high"))

    async def test_a_cancel_while_the_end_is_written_does_not_lose_it(self):
        call, _, wake = await self.approved_nap(self.gate, self.approvals, self.owner)
        wake.touch()
        while self.runner.running:              # the skill ended; the gate is about to record it
            await asyncio.sleep(0.005)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        self.assertTrue(await self.gate.drain(5))
        self.assertEqual([row[:2] for row in self.finish_rows()],
                         [("skill_started", "approved"), ("skill_finished", "approved")])
        self.assertEqual(self.sql("SELECT result FROM pending_approvals")[0][0], {"success": True, "output": "woke\n"})

    async def private_cluster(self, fsync: bool = False) -> tuple[Cluster, Store]:
        root = Path(tempfile.mkdtemp(prefix="ias-gate-pg-"))
        os.chmod(root, 0o755)
        self.addCleanup(shutil.rmtree, root, True)
        cluster = Cluster(root / "pg", fsync=fsync)
        store = await Store.open(cluster.start(), chain=test_chain(self))
        self.addCleanup(cluster.stop)
        self.addAsyncCleanup(store.close)
        return cluster, store

    @slow
    async def test_when_the_store_refuses_the_owner_is_told_the_call_ran(self):
        cluster, store = await self.private_cluster()
        other = self.build(store=store)
        owner = FakeOwner()
        call, _, wake = await self.approved_nap(other.gate, other.approvals, owner)
        os.kill(int((cluster.datadir / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)
        wake.touch()
        self.assertEqual(await asyncio.wait_for(call, 30), {"success": True, "output": "woke\n"})
        self.assertEqual(owner.messages[-1], NOT_SAVED.format(name="nap_high"))

    @slow
    async def test_an_end_refused_during_an_outage_is_written_when_the_database_returns(self):
        cluster, store = await self.private_cluster(fsync=True)      # skill_started survives the kill -9
        other = self.build(store=store)
        owner = FakeOwner()
        call, _, wake = await self.approved_nap(other.gate, other.approvals, owner)
        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        await until(lambda: not running(postmaster), 10)
        wake.touch()
        self.assertEqual(await asyncio.wait_for(call, 30), {"success": True, "output": "woke\n"})   # not held up
        self.assertEqual(owner.messages[-1], NOT_SAVED.format(name="nap_high"))
        self.assertFalse(await other.gate.drain(0.3))      # the end is still kept, waiting for the database
        await asyncio.to_thread(cluster.start)
        self.assertTrue(await other.gate.drain(10))        # written once the database is back
        rows = [(r.event, r.decision) for r in await store.audit_rows(20) if r.event.startswith("skill_")]
        self.assertEqual(sorted(rows), [("skill_finished", "approved"), ("skill_started", "approved")])
        self.assertEqual([a.result for a in await store.approvals(include_closed=True)],
                         [{"success": True, "output": "woke\n"}])
        self.assertEqual(await store.unfinished_calls(), [])    # so no later start takes it for interrupted
        self.assertEqual(await other.gate.record_interrupted(), 0)

    @slow
    async def test_an_end_kept_past_a_daemon_stop_is_written_by_the_next_start_never_interrupted(self):
        cluster, store = await self.private_cluster(fsync=True)
        other = self.build(store=store)
        owner = FakeOwner()
        pid, start = identity()
        dead = f"call={uuid.uuid4().hex} pid={pid} start={start + 1}"   # as seen by the next start: a dead process
        with mock.patch("ias.gate.call_tag", return_value=dead):
            call, _, wake = await self.approved_nap(other.gate, other.approvals, owner)
        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        await until(lambda: not running(postmaster), 10)
        wake.touch()
        self.assertEqual(await asyncio.wait_for(call, 30), {"success": True, "output": "woke\n"})
        self.assertFalse(await other.gate.drain(0.3))
        kept = other.gate.unwritten.path = Config(data_dir=self.tmp).unwritten_file    # as run_daemon sets it
        self.assertEqual(other.gate.unwritten.save(), 1)          # the daemon stops before the database returns
        self.assertEqual(kept.stat().st_mode & 0o777, 0o600)
        await asyncio.to_thread(cluster.start)
        fresh = await Store.open(cluster.dsn, chain=test_chain(self))
        self.addAsyncCleanup(fresh.close)
        following = self.build(store=fresh)                        # the next daemon start
        following.gate.unwritten.path = kept
        self.assertEqual(await following.gate.unwritten.replay(), 1)
        self.assertEqual(await following.gate.record_interrupted(), 0)
        self.assertEqual(await following.gate.unwritten.replay(), 0)
        self.assertFalse(kept.exists())
        rows = [(r.event, r.decision, r.detail) for r in await fresh.audit_rows(20) if r.event.startswith("skill_")]
        self.assertEqual(rows, [("skill_started", "approved", dead), ("skill_finished", "approved", dead)])
        self.assertEqual([a.result for a in await fresh.approvals(include_closed=True)],
                         [{"success": True, "output": "woke\n"}])

    def test_a_kept_end_reads_back_as_it_was_written(self):
        approval = uuid.uuid4()
        entry = AuditEntry("skill_finished", user_id="owner", skill_name="nap_high", risk="High", approval_id=approval,
                           decision="approved", exit_code=0, duration_ms=12, output_size=5, truncated=False,
                           detail="call=x pid=1 start=2")
        end = End(entry, approval, {"success": True, "output": "好\ud800\n"})
        self.assertEqual(End.parse(end.line()), end)
        self.assertEqual(End.parse(End(None, approval, {"a": 1}).line()), End(None, approval, {"a": 1}))

    async def test_a_damaged_kept_file_is_logged_and_dropped(self):
        kept = self.gate.unwritten.path = Config(data_dir=self.tmp).unwritten_file
        kept.write_text("not json\n")
        with self.assertLogs("ias.unwritten", "ERROR"):
            self.assertEqual(await self.gate.unwritten.replay(), 0)
        self.assertFalse(kept.exists())

    async def test_calls_of_dead_processes_are_recorded_as_interrupted_once(self):
        pid, start = identity()
        dead = f"call={uuid.uuid4().hex} pid={pid} start={start + 1}"     # same pid, another process
        live = f"call={uuid.uuid4().hex} pid={pid} start={start}"
        approval = uuid.uuid4()
        self.sql("INSERT INTO pending_approvals (id, expires_at, user_id, skill_name, params, code_hash, status) "
                 "VALUES (%s, now(), 'owner', 'nap_high', '{}', 'v1:x', 'approved')", (approval,))
        for detail, approval_id in ((dead, approval), (live, None), ("no tag", None)):
            self.sql("INSERT INTO audit_log (event, user_id, skill_name, approval_id, detail, prev_hash, hash) "
                     "VALUES ('skill_started', 'owner', 'nap_high', %s, %s, '', '')", (approval_id, detail))
        self.assertEqual(await self.gate.record_interrupted(), 1)
        self.assertEqual(await self.gate.record_interrupted(), 0)
        self.assertEqual(self.sql("SELECT decision, approval_id, detail FROM audit_log WHERE event = 'skill_interrupted'"),
                         [("interrupted", approval, dead)])
        self.assertEqual(self.sql("SELECT result FROM pending_approvals")[0][0], interrupted("nap_high"))


def cut(value: str, data: bytes) -> str:
    """The audit form of a value whose measured text is `data`: check its tail, return its prefix."""
    tail = f"…[truncated, sha256={hashlib.sha256(data).hexdigest()}, {len(data)} bytes]"
    assert value.endswith(tail), value[-120:]
    return value[:-len(tail)]


class ArgumentsBoundTest(GateTestCase):
    """Arguments past ARGUMENTS_MAX as JSON text: refused before validation, whoever calls (`/run` text,
    `ias run` an object), with one small audit row and no approval asked."""

    def refused_rows(self) -> list[tuple]:
        return self.sql("SELECT skill_name, decision, params, detail FROM audit_log WHERE event = 'skill_refused'")

    async def test_an_object_past_the_limit_asks_no_approval(self):
        marker = "m" * ARGUMENTS_MAX                       # what `ias run` passes: an object
        result = await self.gate.call("owner", "mark_high", {"marker": marker}, self.owner.notify)
        self.assertEqual(result, {"success": False, "error": "参数过长：mark_high"})
        self.assertEqual(self.owner.messages, [])
        self.assertEqual(self.sql("SELECT count(*) FROM pending_approvals")[0][0], 0)
        size = len(json.dumps({"marker": marker}, separators=(",", ":")))
        self.assertEqual(self.refused_rows(),
                         [("mark_high", "arguments_too_long", None, f"arguments of {size} bytes (limit {ARGUMENTS_MAX})")])
        self.assertEqual(self.runs(), 0)

    async def test_bytes_not_characters_and_before_validation(self):
        wide = json.dumps({"text": "日" * (ARGUMENTS_MAX // 3)}, ensure_ascii=False)    # fewer characters than the limit
        self.assertLess(len(wide), ARGUMENTS_MAX)
        self.assertEqual(await self.gate.call("owner", "echo_low", wide),
                         {"success": False, "error": "参数过长：echo_low"})
        junk = "{" * (ARGUMENTS_MAX + 1)                   # neither valid JSON nor nested within limits: not parsed
        self.assertEqual(await self.gate.call("owner", "no_such_skill", junk),
                         {"success": False, "error": "参数过长：no_such_skill"})
        at_limit = "[" * ARGUMENTS_MAX                     # at the limit: parsed, and invalid as always
        self.assertTrue((await self.gate.call("owner", "echo_low", at_limit))["error"].startswith("参数错误："))

    async def test_a_long_name_is_cut_where_it_is_echoed(self):
        name = "n" * 10_000
        self.assertEqual(await self.gate.call("owner", name, "{" * (ARGUMENTS_MAX + 1)),
                         {"success": False, "error": f"参数过长：{'n' * 200}…"})
        self.assertEqual(await self.gate.call("owner", name, {}), {"success": False, "error": f"未知技能：{'n' * 200}…"})

    async def test_a_refused_approval_audits_bounded_params(self):
        note = "é" * 3000                                  # 6,000 bytes: the approval message would not fit either
        result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker), "note": note,
                                                             "api_token": "t" * 9000}, self.owner.notify)
        self.assertEqual(result, {"success": False, "error": "参数过长，无法请求确认：mark_high"})
        [(params,)] = self.sql("SELECT params FROM audit_log WHERE event = 'approval_refused'")
        self.assertEqual(params["api_token"], REDACTED)
        self.assertTrue(note.startswith(cut(params["note"], note.encode())))
        self.assertEqual(params["marker"], str(self.marker))


class RedactTest(unittest.TestCase):
    """`audit.redact`: what the audit log keeps of a call's parameters."""

    def test_short_values_and_secrets_as_before(self):
        params = {"password": "p", "nested": {"API_KEY": "k", "ok": 1}, "list": [{"Cookie": "c"}], "to": "a@b",
                  "n": 12345678901234567890, "f": 1.5, "b": True, "none": None}
        self.assertEqual(redact(params), {**params, "password": REDACTED, "nested": {"API_KEY": REDACTED, "ok": 1},
                                          "list": [{"Cookie": REDACTED}]})

    def test_every_value_at_most_the_limit_at_any_depth(self):
        exact = "a" * AUDIT_VALUE_MAX
        long = "b" * (AUDIT_VALUE_MAX + 1)
        params = {"exact": exact, "long": long, "deep": {"x": [long]}, "many": list(range(5000))}
        kept = redact(params)
        self.assertEqual(kept["exact"], exact)
        self.assertEqual(cut(kept["long"], long.encode()), long[:len(cut(kept["long"], long.encode()))])
        for key in ("long", "deep", "many"):
            self.assertLessEqual(len(kept[key].encode()), AUDIT_VALUE_MAX, key)
        deep = json.dumps(params["deep"], separators=(",", ":")).encode()
        self.assertTrue(deep.decode().startswith(cut(kept["deep"], deep)))
        many = json.dumps(params["many"], separators=(",", ":")).encode()
        self.assertTrue(many.decode().startswith(cut(kept["many"], many)))
        self.assertLess(len(json.dumps(kept)), 5 * AUDIT_VALUE_MAX)

    def test_secrets_are_hidden_before_a_value_is_cut_or_hashed(self):
        secret = "hunter2-" * 10
        params = {"blob": [{"password": secret, "pad": "x" * AUDIT_VALUE_MAX}]}
        kept = redact(params)["blob"]
        self.assertNotIn(secret, kept)
        hidden = json.dumps([{"password": REDACTED, "pad": "x" * AUDIT_VALUE_MAX}], separators=(",", ":")).encode()
        cut(kept, hidden)                                  # the hash covers the redacted text

    def test_long_keys_are_cut_and_stay_apart(self):
        one, two = "k" * 1000 + "1", "k" * 1000 + "2"
        kept = redact({one: 1, two: 2, "token" + "z" * 1000: "s"})
        self.assertEqual(len(kept), 3)
        self.assertEqual(sorted(map(str, kept.values())), [REDACTED, "1", "2"])
        for key in kept:
            self.assertLessEqual(len(key.encode()), AUDIT_KEY_MAX)

    def test_cut_on_a_character_boundary(self):
        value = "日" * 2000                                # 6,000 bytes: the cut may not split a character
        kept = redact({"v": value})["v"]
        self.assertTrue(value.startswith(cut(kept, value.encode())))
        self.assertGreater(len(kept.encode()), AUDIT_VALUE_MAX - 4)

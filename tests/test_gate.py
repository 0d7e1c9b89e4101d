"""The gate's finish path: a started run's end is always recorded — cancelled, refused by the store,
or interrupted by a process that died (recorded at the next start)."""
import asyncio
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from ias.approval import Approvals
from ias.gate import NOT_SAVED, Gate
from ias.pgcluster import Cluster
from ias.results import interrupted
from ias.runner import identity
from ias.store import Store
from tests.support import FIXTURES, FakeOwner, GateTestCase, granted, until, with_env
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

    async def test_when_the_store_refuses_the_owner_is_told_the_call_ran(self):
        root = Path(tempfile.mkdtemp(prefix="ias-gate-pg-"))
        os.chmod(root, 0o755)
        self.addCleanup(shutil.rmtree, root, True)
        cluster = Cluster(root / "pg", fsync=False)
        store = await Store.open(cluster.start())
        self.addCleanup(cluster.stop)
        self.addAsyncCleanup(store.close)
        other = self.build(store=store)
        owner = FakeOwner()
        call, _, wake = await self.approved_nap(other.gate, other.approvals, owner)
        os.kill(int((root / "pg" / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)
        wake.touch()
        self.assertEqual(await asyncio.wait_for(call, 30), {"success": True, "output": "woke\n"})
        self.assertEqual(owner.messages[-1], NOT_SAVED.format(name="nap_high"))

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

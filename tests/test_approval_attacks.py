"""Only the code approves: a database writer (another connection, a trigger) never makes a High call run.

Each test plays the attacker against real PostgreSQL while the daemon waits on an approval: a row
set to `approved` behind its back, parameters swapped before or during the owner's reply. Whatever
ends the approval — the right code, a cancel, the timeout, a delivery failure, a restart — nothing
the attacker wrote runs; the model hears `用户没有确认操作`, and the audit log has a `tampered` row.
"""
import asyncio

import psycopg

from tests.support import GateTestCase

EXPIRED = {"success": False, "error": "用户没有确认操作：mark_high"}
TAMPERED_REPLY = "待确认的操作在数据库中被改动，未执行：mark_high"
APPROVE_EVIL = "UPDATE pending_approvals SET status = 'approved', params = jsonb_set(params, '{note}', '\"evil\"')"
EVIL_FUNCTION = ("CREATE FUNCTION evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "NEW.params := jsonb_set(NEW.params, '{note}', '\"evil\"'); RETURN NEW; END $$")
SWAP_PARAMS = "UPDATE pending_approvals SET params = jsonb_set(params, '{note}', '\"evil\"')"


class DatabaseWriterTest(GateTestCase):
    def decisions(self) -> list[tuple]:
        return self.sql("SELECT event, decision FROM audit_log WHERE event LIKE 'approval_%%' ORDER BY id")

    async def reply_after(self, statement: str, reply=lambda code: code) -> None:
        """A High call; the writer runs `statement` while it waits; the owner's reply meets a tampered row."""
        task = self.call_high(note="harmless")
        code = await self.owner.code()
        self.sql(statement)
        self.assertEqual(await self.approvals.redeem("owner", reply(code)), TAMPERED_REPLY)
        self.assertEqual(await asyncio.wait_for(task, 5), EXPIRED)

    def assertNothingRan(self) -> None:
        self.assertEqual(self.runs(), 0)
        events = [event for event, _ in self.sql("SELECT event, decision FROM audit_log")]
        self.assertNotIn("skill_started", events)
        self.assertIn(("approval_tampered", "tampered"), self.decisions())
        self.assertNotIn("pending", [status for [status] in self.sql("SELECT status FROM pending_approvals")])

    async def test_a_row_set_approved_never_runs_when_the_approval_times_out(self):
        self.approvals.timeout = 0.5
        for statement in (APPROVE_EVIL, "UPDATE pending_approvals SET status = 'approved' WHERE status = 'pending'"):
            with self.subTest(statement=statement):
                task = self.call_high(note="harmless")
                await self.owner.code()
                self.sql(statement)
                self.assertEqual(await asyncio.wait_for(task, 5), EXPIRED)
                self.assertNothingRan()

    async def test_a_row_set_approved_never_runs_when_the_owner_cancels(self):
        await self.reply_after(APPROVE_EVIL, lambda code: "0")
        self.assertNothingRan()

    async def test_a_row_set_approved_never_runs_when_the_owner_sends_the_code(self):
        await self.reply_after("UPDATE pending_approvals SET status = 'approved'")
        self.assertNothingRan()

    async def test_swapped_params_never_run_with_the_right_code(self):
        await self.reply_after(SWAP_PARAMS)
        self.assertNothingRan()
        self.assertNotIn(("approval_wrong_code", "wrong_code"), self.decisions())     # the owner's code was right

    async def test_swapped_params_end_the_approval_on_a_wrong_code_too(self):
        await self.reply_after(SWAP_PARAMS, lambda code: f"{(int(code) + 1) % 10 ** 6:06d}")
        self.assertNothingRan()

    async def test_a_row_approved_while_the_message_fails_to_go_out_never_runs(self):
        async def failing(text: str) -> bool:
            self.sql(APPROVE_EVIL)          # the writer strikes while the daemon is sending
            return False
        self.assertEqual(await asyncio.wait_for(self.call_high(note="harmless", notify=failing), 5), EXPIRED)
        self.assertNothingRan()

    async def test_a_deleted_row_ends_the_approval_as_tampered(self):
        await self.reply_after("DELETE FROM pending_approvals")
        self.assertEqual(self.runs(), 0)
        self.assertIn(("approval_tampered", "tampered"), self.decisions())

    async def test_params_swapped_by_a_writer_holding_the_row_lock_never_run(self):
        """Check-then-use: the writer's UPDATE holds the row while the right code arrives, then commits."""
        task = self.call_high(note="harmless")
        code = await self.owner.code()
        writer = await psycopg.AsyncConnection.connect(self.dsn)
        self.addAsyncCleanup(writer.close)
        await writer.execute(SWAP_PARAMS)                       # uncommitted: the row is locked
        reply = asyncio.create_task(self.approvals.redeem("owner", code))
        await self.until_a_backend_waits_for_a_lock()
        await writer.commit()
        self.assertEqual(await asyncio.wait_for(reply, 5), TAMPERED_REPLY)
        self.assertEqual(await asyncio.wait_for(task, 5), EXPIRED)
        self.assertNothingRan()
        self.assertNotIn(("approval_approved", "approved"), self.decisions())

    async def test_a_trigger_rewriting_the_approved_row_runs_nothing(self):
        """The approving UPDATE itself returns other params (a BEFORE trigger): the daemon's copy decides."""
        self.sql(EVIL_FUNCTION)
        task = self.call_high(note="harmless")
        code = await self.owner.code()
        self.sql("CREATE TRIGGER evil BEFORE UPDATE ON pending_approvals FOR EACH ROW "
                 "WHEN (NEW.status = 'approved') EXECUTE FUNCTION evil()")
        self.assertEqual(await self.approvals.redeem("owner", code), TAMPERED_REPLY)
        self.assertEqual(await asyncio.wait_for(task, 5), EXPIRED)
        self.assertNothingRan()

    async def test_a_trigger_rewriting_the_row_as_it_is_created_asks_nothing(self):
        self.sql(EVIL_FUNCTION)
        self.sql("CREATE TRIGGER evil BEFORE INSERT ON pending_approvals FOR EACH ROW EXECUTE FUNCTION evil()")
        self.assertEqual(await asyncio.wait_for(self.call_high(note="harmless"), 5), EXPIRED)
        self.assertEqual(self.owner.messages, [])
        self.assertNothingRan()

    async def test_a_restart_never_runs_a_row_set_approved(self):
        task = self.call_high(note="harmless")
        await self.owner.code()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.sql(APPROVE_EVIL)
        fresh = self.use(self.build())
        self.assertEqual(await fresh.approvals.expire_leftovers(), [])
        self.assertEqual(await fresh.gate.record_interrupted(), 0)
        self.assertEqual(self.runs(), 0)
        [row] = await self.store.approvals(include_closed=True)         # the listing still shows what is stored
        self.assertEqual((row.status, row.params["note"]), ("approved", "evil"))
        self.assertEqual(await self.store.approvals(), [])

    async def test_an_untouched_approval_still_runs_what_the_owner_saw(self):
        task = self.call_high(note="harmless")
        code = await self.owner.code()
        self.assertIn("· note：harmless\n", self.owner.messages[0])
        self.assertEqual(await self.approvals.redeem("owner", code), "已确认，正在执行：mark_high")
        self.assertEqual(await asyncio.wait_for(task, 5), {"success": True, "note": "harmless"})
        self.assertNotIn("tampered", [decision for _, decision in self.decisions()])

    async def until_a_backend_waits_for_a_lock(self, timeout: float = 10) -> None:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (await asyncio.to_thread(self.sql, query))[0][0] == 0:
            if loop.time() > deadline:
                raise AssertionError("the approving UPDATE never waited for the writer's lock")
            await asyncio.sleep(0.01)

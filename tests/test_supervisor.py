"""The supervisor: a crash fails it loudly, shield outlives its caller, close stops groups in order, the turn bound."""
import asyncio
import json
import logging
import unittest

from ias.slash import HELP
from ias.channels.base import Inbound
from ias.router import NOTHING_PENDING, Router
from ias.supervisor import BACKGROUND, RECORDS, TASKS, TURNS, Supervisor
from tests.support import FIXTURES, FakeChannel, GateTestCase, capture_logs, granted, until


async def crash():
    raise ValueError("boom")


class CrashTest(unittest.IsolatedAsyncioTestCase):
    async def test_a_crash_is_logged_with_its_traceback_and_fails_the_daemon(self):
        records = capture_logs(self)
        supervisor = Supervisor(daemon=True)
        supervisor.spawn(crash(), "cruncher")
        await asyncio.wait_for(supervisor.failed.wait(), 5)
        self.assertEqual(supervisor.reason, "task cruncher crashed: ValueError('boom')")
        (record,) = [r for r in records if r.levelno == logging.CRITICAL]
        self.assertEqual(record.getMessage(), "task cruncher crashed; stopping iAs")
        self.assertEqual(record.exc_info[0], ValueError)

    async def test_a_one_offs_supervisor_logs_the_crash_and_leaves_the_decision_to_its_caller(self):
        records = capture_logs(self)
        supervisor = Supervisor()
        supervisor.spawn(crash(), "helper", group=TURNS)
        await asyncio.wait_for(supervisor.failed.wait(), 5)
        (record,) = [r for r in records if r.levelno == logging.CRITICAL]
        self.assertEqual(record.getMessage(), "task helper crashed")         # not "stopping iAs"
        self.assertTrue(await supervisor.close(1))

    async def test_cancelled_and_finished_tasks_are_no_failure(self):
        supervisor = Supervisor()
        done = supervisor.spawn(asyncio.sleep(0), "short")
        forever = supervisor.spawn(asyncio.Event().wait(), "forever", group=TASKS)
        await done
        self.assertEqual((supervisor.scope(BACKGROUND).active, supervisor.scope(TASKS).active), (0, 1))
        await supervisor.close(5)
        self.assertTrue(forever.cancelled())
        self.assertFalse(supervisor.failed.is_set())

    async def test_a_group_is_made_once_and_its_bound_cannot_change(self):
        supervisor = Supervisor()
        turns = supervisor.scope(TURNS, limit=2)
        self.assertIs(supervisor.scope(TURNS), turns)
        with self.assertRaises(ValueError):
            supervisor.scope(TURNS, limit=3)


class ShieldTest(unittest.IsolatedAsyncioTestCase):
    async def test_a_shielded_task_outlives_its_cancelled_caller_and_close_waits_for_it(self):
        supervisor = Supervisor()
        release, written = asyncio.Event(), []

        async def record():
            await release.wait()
            written.append("end")

        caller = asyncio.create_task(supervisor.shield(record(), "end of a call"))
        await asyncio.sleep(0)
        caller.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await caller
        self.assertEqual(supervisor.scope(RECORDS).active, 1)         # still running, under the supervisor
        closing = asyncio.create_task(supervisor.close(5))
        await asyncio.sleep(0.05)
        self.assertFalse(closing.done())                              # close waits for it …
        release.set()
        self.assertTrue(await closing)
        self.assertEqual(written, ["end"])                            # … and it ran to its end

    async def test_the_caller_gets_the_result_or_the_exception_and_the_supervisor_stays_well(self):
        supervisor = Supervisor()

        async def seven():
            return 7
        self.assertEqual(await supervisor.shield(seven(), "seven"), 7)
        with self.assertRaises(ValueError):
            await supervisor.shield(crash(), "refused")              # e.g. a StoreError the caller handles
        await asyncio.sleep(0)
        self.assertFalse(supervisor.failed.is_set())

    async def test_once_the_caller_is_gone_a_crash_of_the_shielded_task_fails_the_supervisor(self):
        records = capture_logs(self)
        supervisor = Supervisor()
        release = asyncio.Event()

        async def late_crash():
            await release.wait()
            raise ValueError("late")

        caller = asyncio.create_task(supervisor.shield(late_crash(), "orphan"))
        await asyncio.sleep(0)
        caller.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await caller
        release.set()
        await asyncio.wait_for(supervisor.failed.wait(), 5)
        self.assertIn("orphan", supervisor.reason)
        self.assertTrue(any(r.levelno == logging.CRITICAL and r.exc_info for r in records))

    async def test_a_cancelled_caller_waits_the_grace_for_it(self):
        supervisor = Supervisor()
        done = []

        async def quick():
            await asyncio.sleep(0.05)
            done.append(1)

        caller = asyncio.create_task(supervisor.shield(quick(), "send", grace=5))
        await asyncio.sleep(0)
        caller.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await caller
        self.assertEqual(done, [1])                                   # finished before the cancel completed

    async def test_a_hold_is_waited_for_like_a_task(self):
        supervisor = Supervisor()
        records = supervisor.scope(RECORDS)
        with records.hold():
            self.assertEqual(records.active, 1)
            self.assertFalse(await records.wait(0.01))
        self.assertTrue(await records.wait(0.01))


class CloseOrderTest(unittest.IsolatedAsyncioTestCase):
    async def test_groups_stop_in_the_order_given_then_the_rest_then_what_the_cancellations_recorded(self):
        supervisor = Supervisor()
        events = []

        async def record(what, delay=0.0):
            await asyncio.sleep(delay)
            events.append(f"{what} recorded")

        async def until_cancelled(what, then_record=False):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append(f"{what} cancelled")
                if then_record:          # as a cancelled call does: its end is recorded by a task of its own
                    supervisor.scope(RECORDS).spawn(record(f"{what}'s end", 0.05), "end")
                raise

        supervisor.spawn(until_cancelled("background"), "outbox")
        supervisor.spawn(until_cancelled("task"), "task run", group=TASKS)
        supervisor.spawn(until_cancelled("turn", then_record=True), "turn", group=TURNS)
        caller = asyncio.create_task(supervisor.shield(record("call", delay=0.05), "end of a call"))
        await asyncio.sleep(0)
        self.assertTrue(await supervisor.close(5, order=(RECORDS, TURNS, TASKS)))
        self.assertEqual(events, ["call recorded", "turn cancelled", "task cancelled", "background cancelled",
                                  "turn's end recorded"])
        await caller

    async def test_a_record_that_does_not_end_is_reported_and_cancelled_at_the_end(self):
        records = capture_logs(self)
        supervisor = Supervisor()
        stuck = supervisor.scope(RECORDS).spawn(asyncio.Event().wait(), "unwritten end")
        self.assertFalse(await supervisor.close(0.05, order=(RECORDS,)))
        self.assertTrue(stuck.cancelled())
        self.assertTrue(any("1 records task(s) did not end" in r.getMessage() for r in records))
        self.assertFalse(supervisor.failed.is_set())


class SlotTest(unittest.IsolatedAsyncioTestCase):
    async def test_the_one_past_the_bound_waits_then_runs_and_the_order_is_kept(self):
        turns = Supervisor().scope(TURNS, limit=2)
        gates = [asyncio.Event() for _ in range(5)]
        began = []

        async def turn(i):
            async with turns.slot():
                began.append(i)
                await gates[i].wait()

        tasks = [turns.spawn(turn(i), f"turn {i}") for i in range(5)]
        await until(lambda: len(began) == 2)
        await asyncio.sleep(0.02)
        self.assertEqual((began, turns.running, turns.waiting), ([0, 1], 2, 3))
        gates[1].set()
        await until(lambda: len(began) == 3)
        self.assertEqual(began, [0, 1, 2])
        tasks[3].cancel()                           # one that waits gives its place up …
        gates[0].set()
        await until(lambda: len(began) == 4)
        self.assertEqual(began, [0, 1, 2, 4])       # … and the next in line takes the slot; none is dropped
        for gate in gates:
            gate.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.assertEqual((turns.running, turns.waiting, turns.active), (0, 0, 0))


class TurnBoundTest(GateTestCase):
    """The router's bound on agent turns (TURNS_MAX, here 1): another user's turn waits, then runs; approval
    replies and one user's order are unaffected."""
    system_skills = FIXTURES / "gate"
    user_skills = FIXTURES / "router"

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.channel = FakeChannel("wechat")
        app = self.use(self.build(channels=[self.channel], primary=self.channel))
        self.router = Router(app.approvals, app.agent, {"wechat": self.channel}, self.channel, app.outbox,
                             supervisor=Supervisor(), turns_max=1)
        self.addAsyncCleanup(self.router.cancel)

    def deliver(self, text: str, user: str) -> asyncio.Task:
        return asyncio.create_task(self.router.deliver(Inbound("wechat", user, text)))

    async def test_a_turn_past_the_bound_waits_for_a_slot_and_then_runs_in_order(self):
        pidfile, wake = granted("pid"), granted("wake")
        first = self.deliver(f'/run wait_low {json.dumps({"pidfile": str(pidfile), "wake": str(wake)})}', "guest")
        await until(pidfile.exists)
        others = [self.deliver("/help", "owner"), self.deliver("/reset", "owner"), self.deliver("/help", "third")]
        await until(lambda: self.router.turns.waiting == 2)     # the owner's first and third's; the owner's
        await self.deliver("123456", "fourth")                  # second waits behind their first; a stray code
        self.assertEqual(self.channel.sent, [("fourth", NOTHING_PENDING)])     # is no turn: answered at once
        self.assertEqual(self.router.turns.running, 1)
        wake.touch()
        await asyncio.gather(first, *others)
        owner = [text for user, text in self.channel.sent if user == "owner"]
        self.assertEqual(owner, [HELP, "对话记录已清空。"])       # in the order they came, none dropped
        self.assertIn(("third", HELP), self.channel.sent)
        self.assertEqual(len(self.channel.sent), 5)
        self.assertEqual((self.router.turns.running, self.router.dispatching), (0, 0))


if __name__ == "__main__":
    unittest.main()

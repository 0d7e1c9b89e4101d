"""The scheduler against real PostgreSQL with an injected clock: each slot exactly once."""
import asyncio
import json
import os
import subprocess
import sys
import unittest
from dataclasses import replace
from datetime import datetime, timedelta

from ias.clock import TZ
from ias.llm import LLM
from ias.scheduler import Scheduler, TaskError, add_task, keeper_ask, set_enabled, update_task, when_text
from ias.store import Store, Task
from tests.servers.llm import LLMServer, calls, text
from tests.support import CODE_LINE, REPO, FakeChannel, FakeClock, GateTestCase, StoreTestCase, slow

T0 = datetime(2026, 12, 2, 7, 0, tzinfo=TZ)          # a Wednesday morning, Beijing time


class Recorder:
    """An `execute` that records what ran, and when by the monotonic clock (if given one)."""

    def __init__(self, clock: FakeClock | None = None):
        self.clock = clock
        self.ran: list[tuple[int, str]] = []
        self.at: list[float] = []

    async def __call__(self, task, run_id) -> str:
        self.ran.append((task.id, task.text))
        if self.clock is not None:
            self.at.append(self.clock.monotonic())
        return task.text


class PresentationTest(unittest.TestCase):
    """How a due task is named to the owner: Beijing time, relative to today there."""

    def test_when_text(self):
        now = datetime(2026, 12, 2, 23, 30, tzinfo=TZ)
        for due, words in ((datetime(2026, 12, 2, 23, 45, tzinfo=TZ), "今天 23:45"),
                           (datetime(2026, 12, 3, 7, 0, tzinfo=TZ), "明早 07:00"),
                           (datetime(2026, 12, 3, 15, 0, tzinfo=TZ), "明天 15:00"),
                           (datetime(2026, 12, 4, 9, 5, tzinfo=TZ), "后天 09:05"),
                           (datetime(2026, 12, 5, 7, 0, tzinfo=TZ), "12月5日 07:00")):
            with self.subTest(words=words):
                self.assertEqual(when_text(due, now), words)
        # Stored times are UTC: 23:00 UTC is 07:00 the next morning in Beijing.
        self.assertEqual(when_text(datetime.fromisoformat("2026-12-02T23:00:00+00:00"), now), "明早 07:00")

    def test_keeper_ask(self):
        now = datetime(2026, 12, 2, 20, 0, tzinfo=TZ)
        task = Task(1, "owner", "吃药", "0 8 * * *", "reminder", "该吃药了", True, datetime(2026, 12, 3, 8, 0, tzinfo=TZ),
                    now, now)
        self.assertEqual(keeper_ask(task, now), "明早 08:00 有提醒「吃药」：回复任意内容，微信才允许我按时发送。")
        task = replace(task, name="早报", kind="prompt", next_run_at=datetime(2026, 12, 3, 15, 0, tzinfo=TZ))
        self.assertEqual(keeper_ask(task, now), "明天 15:00 有定时任务「早报」：回复任意内容，微信才允许我按时发送。")


class SchedulerTest(StoreTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.clock = FakeClock(T0)
        self.recorder = Recorder(self.clock)
        self.scheduler = Scheduler(self.store, self.recorder, now=self.clock.now, monotonic=self.clock.monotonic)

    async def asyncTearDown(self):
        await self.scheduler.stop()     # runs still in flight end before the store closes, not after
        await super().asyncTearDown()

    async def tick(self, at: datetime, scheduler: Scheduler | None = None) -> int:
        self.clock.at = at
        runs = await (scheduler or self.scheduler).tick()
        await asyncio.gather(*runs)
        return len(runs)

    async def test_fires_on_time(self):
        task = await add_task(self.store, "owner", "早安", "0 8 * * *", "reminder", "起床啦", now=T0)
        self.assertEqual(task.next_run_at, T0.replace(hour=8))
        self.assertEqual(await self.tick(T0.replace(hour=7, minute=59, second=59)), 0)
        self.assertEqual(await self.tick(T0.replace(hour=8)), 1)
        self.assertEqual(await self.tick(T0.replace(hour=8, minute=0, second=30)), 0)
        self.assertEqual(self.recorder.ran, [(task.id, "起床啦")])
        self.assertEqual((await self.store.task(task.id)).next_run_at, T0.replace(day=3, hour=8))
        [run] = self.task_runs(task.id)
        self.assertEqual((run.status, run.reply, run.slot), ("ok", "起床啦", T0.replace(hour=8)))
        self.assertEqual(await self.tick(T0.replace(day=3, hour=8, minute=1)), 1)

    async def test_missed_slots_run_once_then_regular_schedule(self):
        task = await add_task(self.store, "owner", "hourly", "every 1h", "reminder", "tick", now=T0)
        # The daemon was down from 07:30 to 12:30: four slots (08–11, 12:00) missed.
        self.assertEqual(await self.tick(T0.replace(hour=12, minute=30)), 1)
        self.assertEqual(await self.tick(T0.replace(hour=12, minute=31)), 0)
        self.assertEqual((await self.store.task(task.id)).next_run_at, T0.replace(hour=13))
        self.assertEqual(await self.tick(T0.replace(hour=13)), 1)
        self.assertEqual(len(self.recorder.ran), 2)

    async def test_two_loops_on_one_database_run_each_slot_once(self):
        other_store = await Store.open(self.dsn)
        other = Scheduler(other_store, self.recorder, now=self.clock.now)
        try:
            tasks = [await add_task(self.store, "owner", f"t{i}", "every 1m", "reminder", str(i), now=T0)
                     for i in range(5)]
            for minute in range(1, 11):
                self.clock.at = T0 + timedelta(minutes=minute)
                runs = await asyncio.gather(self.scheduler.tick(), other.tick())
                await asyncio.gather(*runs[0], *runs[1])
            self.assertEqual(len(self.recorder.ran), 5 * 10)
            for task in tasks:
                slots = [r.slot for r in self.task_runs(task.id)]
                self.assertEqual(len(slots), len(set(slots)), slots)
        finally:
            await other_store.close()

    async def test_one_shot_disabled_after_its_run(self):
        task = await add_task(self.store, "owner", "once", "2026-12-24 08:00", "reminder", "平安夜", now=T0)
        self.assertEqual(await self.tick(datetime(2026, 12, 24, 8, 0, 1, tzinfo=TZ)), 1)
        done = await self.store.task(task.id)
        self.assertEqual((done.enabled, done.next_run_at), (False, None))
        self.assertEqual(await self.tick(datetime(2027, 1, 1, tzinfo=TZ)), 0)
        with self.assertRaisesRegex(TaskError, "already past"):
            await add_task(self.store, "owner", "late", "2026-12-01 08:00", "reminder", "x", now=T0)

    async def test_paused_task_never_fires_and_resume_skips_missed_slots(self):
        task = await add_task(self.store, "owner", "p", "*/10 * * * *", "reminder", "x", now=T0)
        await set_enabled(self.store, task.id, False, now=T0)
        for minutes in (10, 20, 60, 600):
            self.assertEqual(await self.tick(T0 + timedelta(minutes=minutes)), 0)
        resumed = await set_enabled(self.store, task.id, True, now=T0 + timedelta(minutes=605))
        self.assertEqual(resumed.next_run_at, T0 + timedelta(minutes=610))
        self.assertEqual(self.recorder.ran, [])

    async def test_update_and_bad_input(self):
        task = await add_task(self.store, "owner", "t", "0 8 * * *", "reminder", "x", now=T0)
        updated = await update_task(self.store, task.id, schedule="30 9 * * 1-5", text="y", now=T0)
        self.assertEqual((updated.schedule, updated.text, updated.next_run_at), ("30 9 * * 1-5", "y", T0.replace(hour=9, minute=30)))
        for bad in ("61 * * * *", "every 0m", "whenever", ""):
            with self.assertRaises(TaskError):
                await add_task(self.store, "owner", "t", bad, "reminder", "x", now=T0)
        with self.assertRaisesRegex(TaskError, "kind"):
            await add_task(self.store, "owner", "t", "@daily", "email", "x", now=T0)
        with self.assertRaisesRegex(TaskError, "no task with id 999"):
            await update_task(self.store, 999, text="z")
        # Schedules past what datetime holds, or with a 5,000-digit field: a short TaskError.
        for bad in ("9999-12-31 23:59+00:00", "1" * 5000 + " * * * *", "every " + "9" * 5000 + "m"):
            with self.subTest(bad=bad[:30]):
                with self.assertRaises(TaskError) as caught:
                    await add_task(self.store, "owner", "t", bad, "reminder", "x", now=T0)
                self.assertLess(len(str(caught.exception)), 250)
                with self.assertRaises(TaskError):
                    await update_task(self.store, task.id, schedule=bad, now=T0)

    async def test_failed_run_is_recorded_and_not_repeated(self):
        async def broken(task, run_id):
            raise RuntimeError("channel down")
        scheduler = Scheduler(self.store, broken, now=self.clock.now)
        task = await add_task(self.store, "owner", "t", "0 8 * * *", "reminder", "x", now=T0)
        self.assertEqual(await self.tick(T0.replace(hour=8), scheduler), 1)
        self.assertEqual(await self.tick(T0.replace(hour=8, minute=5), scheduler), 0)
        [run] = self.task_runs(task.id)
        self.assertEqual((run.status, run.error), ("error", "channel down"))

    async def simulate(self, seconds: float, jumps: tuple[tuple[float, timedelta], ...] = ()) -> None:
        """Run the real loop for `seconds` of simulated time: its sleeps pass at once, advancing
        both clocks. `jumps`: (seconds from now, step) — the wall clock steps by that much then,
        in the middle of whatever sleep spans it."""
        end = self.clock.seconds + seconds
        pending = sorted((self.clock.seconds + at, step) for at, step in jumps)
        over = asyncio.Event()

        async def sleep(timeout: float) -> bool:
            for _ in range(3):
                await asyncio.sleep(0)           # runs just started record the time they ran
            wake = min(self.clock.seconds + timeout, end)
            while pending and pending[0][0] <= wake:
                at, step = pending.pop(0)
                self.clock.advance(at - self.clock.seconds)
                self.clock.at += step
            self.clock.advance(wake - self.clock.seconds)
            if self.clock.seconds >= end:
                over.set()
                await asyncio.Event().wait()    # until cancelled
            return False

        self.store.wait_for_task_change = sleep
        loop = asyncio.create_task(self.scheduler.run())
        try:
            await asyncio.wait_for(over.wait(), 60)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            del self.store.wait_for_task_change

    async def test_a_forward_jump_runs_a_due_reminder_within_a_minute(self):
        """The wall clock jumps 40 minutes ahead while the loop sleeps towards a reminder due in 30."""
        await add_task(self.store, "owner", "r", "2026-12-02 07:30", "reminder", "开会", now=T0)
        jumped = self.clock.seconds + 5
        await self.simulate(3 * 3600, jumps=((5, timedelta(minutes=40)),))
        self.assertEqual([text for _, text in self.recorder.ran], ["开会"])
        self.assertLessEqual(self.recorder.at[0] - jumped, 60)

    async def test_a_backward_jump_keeps_an_interval_task_on_its_period(self):
        """Every 20 s, for 5 minutes; the wall clock goes back an hour, later back 2 minutes more
        (over slots that already ran): the task still runs every 20 s of monotonic time."""
        task = await add_task(self.store, "owner", "t", "every 20s", "reminder", "tick", now=T0)
        start = self.clock.seconds
        await self.simulate(20 * 60 + 1, jumps=((5 * 60 + 7, timedelta(hours=-1)), (10 * 60 + 3, timedelta(minutes=-2))))
        gaps = [round(b - a, 3) for a, b in zip(self.recorder.at, self.recorder.at[1:])]
        self.assertEqual(round(self.recorder.at[0] - start, 3), 20)
        self.assertTrue(all(19.9 <= gap <= 20.1 for gap in gaps), gaps)
        self.assertEqual(len(self.recorder.ran), 60)
        self.assertEqual(len(self.task_runs(task.id)), 60)

    async def test_real_loop_sleeps_until_due_and_wakes_on_change(self):
        scheduler = Scheduler(self.store, self.recorder)         # the real clock
        loop = asyncio.create_task(scheduler.run())
        try:
            await asyncio.sleep(0.3)                             # asleep: no task at all
            soon = (datetime.now(TZ) + timedelta(seconds=1.5)).strftime("%Y-%m-%d %H:%M:%S")
            await add_task(self.store, "owner", "soon", soon, "reminder", "now!")
            for _ in range(100):
                if self.recorder.ran:
                    break
                await asyncio.sleep(0.05)
            self.assertEqual([t for _, t in self.recorder.ran], ["now!"])
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await scheduler.stop()      # its run too: else it may take a connection after the store closed


class TaskThroughAgentTest(GateTestCase):
    """Prompt tasks run through the agent; the model manages tasks through the two skills."""

    system_skills = REPO / "resources" / "skills"

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01,))
        self.channel = FakeChannel()
        self.use(self.build(llm=self.llm, channels=[self.channel], primary=self.channel))

    async def asyncTearDown(self):
        await self.llm.close()
        await asyncio.to_thread(self.server.__exit__)
        await super().asyncTearDown()

    async def test_prompt_task_reply_reaches_the_owner(self):
        self.server.script(calls(("get_current_datetime", {"format": "date"})), text("早上好！今天是星期三。"))
        task = await add_task(self.store, "owner", "早报", "0 7 * * *", "prompt", "告诉我今天星期几", now=T0 - timedelta(hours=1))
        scheduler = Scheduler(self.store, self.router.run_task, now=lambda: T0)
        await asyncio.gather(*await scheduler.tick())
        self.assertEqual(self.channel.sent, [("owner", "早上好！今天是星期三。")])
        self.assertIn("告诉我今天星期几", self.server.requests[0]["messages"][-1]["content"])
        [run] = self.task_runs(task.id)
        self.assertEqual((run.status, run.reply), ("ok", "早上好！今天是星期三。"))

    async def test_model_lists_and_adds_a_task_after_approval_and_it_fires(self):
        when = datetime.now(TZ) + timedelta(days=1)
        slot = when.strftime("%Y-%m-%d %H:%M")
        self.server.script(
            calls(("manage_scheduled_task", {"action": "add", "name": "喝水", "schedule": slot,
                                             "kind": "reminder", "text": "该喝水了"})),
            text("已添加。"),
            calls(("list_scheduled_tasks", {})),
            text("你有一个任务：喝水。"))
        turn = asyncio.create_task(self.router.turn("owner", "明天提醒我喝水", self.channel))
        message = await self.channel.wait_for("确认码：")
        self.assertIn(f"\n· 时间：{slot}\n", message)
        await self.approvals.redeem("owner", CODE_LINE.search(message).group(1))
        self.assertEqual(await turn, "已添加。")
        added = json.loads(self.server.requests[1]["messages"][-1]["content"])
        self.assertTrue(added["success"], added)
        self.assertEqual(added["task"]["name"], "喝水")

        self.assertEqual(await self.router.turn("owner", "我有哪些任务", self.channel), "你有一个任务：喝水。")
        listed = json.loads(self.server.requests[3]["messages"][-1]["content"])
        self.assertEqual([t["name"] for t in listed["tasks"]], ["喝水"])

        fire_at = datetime.strptime(slot, "%Y-%m-%d %H:%M").replace(tzinfo=TZ)
        scheduler = Scheduler(self.store, self.router.run_task, now=lambda: fire_at)
        await asyncio.gather(*await scheduler.tick())
        self.assertEqual(self.channel.sent[-1], ("owner", "该喝水了"))

    async def test_high_skill_in_a_task_ends_unconfirmed_when_the_code_cannot_be_sent(self):
        refusing = FakeChannel(deliver=False)          # e.g. outside WeChat's 24-hour window
        router = self.build(llm=self.llm, channels=[refusing], primary=refusing).router
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), text("没能确认。"))
        task = await add_task(self.store, "owner", "t", "0 8 * * *", "prompt", "标记", now=T0)
        scheduler = Scheduler(self.store, router.run_task, now=lambda: T0.replace(hour=8))
        await asyncio.gather(*await scheduler.tick())
        self.assertEqual(json.loads(self.server.requests[1]["messages"][-1]["content"]),
                         {"success": False, "error": "用户没有确认操作：mark_high"})
        self.assertEqual(self.runs(), 0)
        [run] = self.task_runs(task.id)
        # It ran; its reply could not be delivered either and waits in the outbox (issue 13).
        self.assertEqual((run.status, run.delivery), ("ok", "queued"))
        [row] = await self.store.queued("owner")
        self.assertEqual((row.text, row.kind, row.task_run_id, row.reason), ("没能确认。", "task", run.id, "send failed"))

    async def test_task_skill_errors_are_clear(self):
        self.server.script(calls(("manage_scheduled_task", {"action": "pause"})), text("ok"))
        turn = asyncio.create_task(self.router.turn("owner", "暂停任务", self.channel))
        message = await self.channel.wait_for("确认码：")
        await self.approvals.redeem("owner", CODE_LINE.search(message).group(1))
        await turn
        result = json.loads(self.server.requests[1]["messages"][-1]["content"])
        self.assertEqual(result, {"success": False, "error": "pause needs the task id (see list_scheduled_tasks)"})


@slow
class TasksCliTest(StoreTestCase):
    def ias(self, *args):
        env = {**os.environ, "IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": "/nonexistent",
               "TZ": "America/New_York"}            # the machine's zone: not the one shown
        return subprocess.run([sys.executable, str(REPO / "ias.py"), "tasks", *args], capture_output=True, text=True,
                              env=env, timeout=60)

    async def test_add_echoes_three_runs_and_rejects_bad_schedules(self):
        result = await asyncio.to_thread(self.ias, "add", "--name", "n", "--schedule", "0 7 * * *", "--text", "t")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.count("next: "), 3)
        self.assertRegex(result.stdout, r"next: \d{4}-\d\d-\d\d 07:00:00 (CST|Asia/Shanghai)\n")
        bad = await asyncio.to_thread(self.ias, "add", "--name", "n", "--schedule", "0 25 * * *", "--text", "t")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("hour", bad.stderr)
        listed = await asyncio.to_thread(self.ias, "list", "--json")
        self.assertEqual([t["schedule"] for t in json.loads(listed.stdout)], ["0 7 * * *"])
        for action in ("pause", "resume", "remove"):
            self.assertEqual((await asyncio.to_thread(self.ias, action, "1")).returncode, 0)
        self.assertEqual((await asyncio.to_thread(self.ias, "remove", "1")).returncode, 1)

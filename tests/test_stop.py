"""The stop word (SPEC 12): it overtakes the queue, ends the turn, its skill, its approval and what waits."""
import asyncio
import json
import time
from types import SimpleNamespace

from ias.channels.base import Inbound
from ias.monitor import DatabaseMonitor
from ias.processes import members
from ias.stopping import STOPPED, is_stop
from tests.support import (FIXTURES, FakeChannel, FlakyStore, GateTestCase, ScriptedLLM, answer, ask, granted,
                           skill_pgid, until)


class StopTestCase(GateTestCase):
    system_skills = FIXTURES / "gate"          # mark_high
    user_skills = FIXTURES / "stop"            # nap60: a minute's sleep

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.model = ScriptedLLM()
        self.wechat = FakeChannel("wechat")
        self.wechat.resumable = True
        self.use(self.build(llm=self.model, channels=[self.wechat], primary=self.wechat))

    def deliver(self, text: str, user: str = "owner") -> asyncio.Task:
        return asyncio.create_task(self.router.deliver(Inbound("wechat", user, text)))

    async def napping(self) -> tuple[asyncio.Task, int]:
        """A turn whose model calls nap60 (and would answer after it): the turn's task and the skill's group."""
        pidfile = granted("pid")
        self.model.script(ask(("nap60", {"pidfile": str(pidfile)})), answer("睡醒了。"))
        turn = self.deliver("睡一分钟")
        await until(pidfile.exists, 30)
        return turn, skill_pgid(pidfile)

    async def gone(self, pgid: int, since: float | None = None, within: float = 2.0) -> None:
        """Wait until no process of group `pgid` is left, at most `within` s after `since` (default: now)."""
        deadline = (time.monotonic() if since is None else since) + within
        while members(pgid):
            self.assertLess(time.monotonic(), deadline, f"process group {pgid} outlived the stop")
            await asyncio.sleep(0.02)

    def stop_rows(self) -> list[str]:
        return [detail for (detail,) in self.sql("SELECT detail FROM audit_log WHERE event = 'stop' ORDER BY id")]

    def replies(self) -> list[str]:
        return [text for _, text in self.wechat.sent]


class StopTest(StopTestCase):
    async def test_stop_kills_the_running_skill_and_the_turn_calls_the_model_no_more(self):
        turn, pgid = await self.napping()
        self.assertTrue(members(pgid))
        stopped = time.monotonic()
        await self.deliver("停止")
        await self.gone(pgid, stopped)
        await asyncio.wait_for(turn, 10)
        self.assertEqual(self.replies(), [STOPPED])
        self.assertEqual(len(self.model.bodies), 1)
        self.assertEqual(self.model.steps, [answer("睡醒了。")])        # the second answer stays unused
        await self.gate.drain(5)
        self.assertEqual(self.sql("SELECT decision FROM audit_log WHERE event = 'skill_finished'"), [("cancelled",)])
        self.assertEqual(self.stop_rows(), ["turns=1 skills=1 approvals=0 queued=0"])
        history = await self.store.recent_messages("owner", 10)        # the next turn knows it was stopped
        self.assertEqual([(m["role"], m["content"]) for m in history], [("user", "睡一分钟"), ("assistant", STOPPED)])
        self.assertEqual(await self.store.pending_inbound(), [])
        self.assertEqual(self.router.users_in_turn, 0)

    async def test_stop_rejects_the_pending_approval(self):
        self.model.script(ask(("mark_high", {"marker": str(self.marker)})), answer("标好了。"))
        turn = self.deliver("请标记")
        await self.wechat.wait_for("确认码：")
        await self.deliver("stop")
        await asyncio.wait_for(turn, 10)
        self.assertEqual(self.sql("SELECT status FROM pending_approvals"), [("rejected",)])
        self.assertEqual(self.sql("SELECT detail FROM audit_log WHERE event = 'approval_rejected'"), [("stop",)])
        self.assertEqual(self.replies()[1:], [STOPPED])
        self.assertEqual(len(self.model.bodies), 1)
        self.assertEqual(self.runs(), 0)
        self.assertEqual(self.stop_rows(), ["turns=1 skills=0 approvals=1 queued=0"])

    async def test_messages_queued_behind_the_turn_are_dropped_and_never_replayed(self):
        turn, pgid = await self.napping()
        queued = [self.deliver(text) for text in ("然后帮我查天气", "/help", "123456")]
        # All in line for their turn: the outbox awaits their answers, and holds back a reminder meanwhile.
        await until(lambda: self.app.outbox._awaiting.get("owner", (0, 0))[0] == 4)
        await self.app.outbox.send("owner", "提醒：喝水", "wechat", "reminder")
        self.assertEqual(self.replies(), [])
        await self.deliver("停止")
        await asyncio.wait_for(asyncio.gather(turn, *queued), 10)
        self.assertEqual(self.replies(), [STOPPED, "提醒：喝水"])     # no answer awaited for the dropped ones
        self.assertEqual(len(self.model.bodies), 1)
        self.assertNotIn("然后帮我查天气", json.dumps(self.model.requests, ensure_ascii=False))
        self.assertEqual(self.stop_rows(), ["turns=1 skills=1 approvals=0 queued=3"])
        self.assertEqual(await self.store.pending_inbound(), [])
        history = await self.store.recent_messages("owner", 10)
        self.assertEqual([m["content"] for m in history], ["睡一分钟", STOPPED])     # the dropped ones are not there
        await self.app.router.cancel()                  # a restart: nothing left to replay
        channel = FakeChannel("wechat")
        channel.resumable = True
        later = self.build(llm=ScriptedLLM(), channels=[channel], primary=channel)
        self.addAsyncCleanup(later.router.cancel)
        self.assertEqual(await later.router.replay(), 0)
        self.assertEqual(channel.sent, [])
        await self.gone(pgid)

    async def test_stop_with_nothing_running_is_answered_too(self):
        await self.deliver("停止")
        self.assertEqual(self.replies(), [STOPPED])
        self.assertEqual(self.stop_rows(), ["turns=0 skills=0 approvals=0 queued=0"])
        self.assertEqual(await self.store.pending_inbound(), [])
        self.model.assert_complete()                    # the model never heard of it

    async def test_the_words_match_after_nfkc_in_any_case_with_trailing_punctuation(self):
        for text in ("停止", "stop", "STOP", "Stop", "/stop", "/STOP", "停止！", "停止!", "stop.", "停止。", " 停止 ",
                     "ＳＴＯＰ", "／ｓｔｏｐ", "停止！！", "stop?!", "停止 。", "stop/"):
            self.assertTrue(is_stop(text), text)
        for text in ("停止发送邮件", "stop it", "不要停止", "/stopped", "停 止", "", "。", "!stop", "stopp"):
            self.assertFalse(is_stop(text), text)
        await self.deliver("ＳＴＯＰ！")
        self.model.script(answer("好的，不发了。"))
        await self.deliver("停止发送邮件")                  # not the stop word: the model gets it
        self.assertEqual(self.replies(), [STOPPED, "好的，不发了。"])
        self.assertEqual(self.model.requests[0]["messages"][-1]["content"], "停止发送邮件")

    async def test_stop_reaching_a_turn_is_harmless_and_listed_in_help(self):
        self.assertEqual(await self.agent.turn("owner", "/stop", None), STOPPED)
        self.assertIn("/stop", await self.agent.turn("owner", "/help", None))
        self.model.assert_complete()


class StopAndShutdownTest(StopTestCase):
    async def test_a_shutdown_mid_turn_still_leaves_the_message_pending(self):
        turn, pgid = await self.napping()
        await self.router.cancel()
        await asyncio.gather(turn, return_exceptions=True)
        await self.gone(pgid)
        [row] = await self.store.pending_inbound()
        self.assertEqual(row.text, "睡一分钟")
        self.assertEqual(await self.store.recent_messages("owner", 10), [])
        self.assertEqual(self.replies(), [])

    async def test_a_scheduled_prompt_tasks_turn_is_stopped(self):
        pidfile = granted("pid")
        self.model.script(ask(("nap60", {"pidfile": str(pidfile)})), answer("任务完成。"))
        task = SimpleNamespace(id=1, kind="prompt", user_id="owner", name="午睡", text="睡一分钟", next_run_at=None)
        run = asyncio.create_task(self.router.run_task(task))
        await until(pidfile.exists, 30)
        pgid = skill_pgid(pidfile)
        await self.deliver("停止")
        self.assertEqual(await asyncio.wait_for(run, 10), STOPPED)
        await self.gone(pgid)
        self.assertEqual(self.replies(), [STOPPED])      # the task sends nothing of its own
        self.assertEqual(len(self.model.bodies), 1)
        self.assertEqual(self.stop_rows(), ["turns=1 skills=1 approvals=0 queued=0"])


class StopWithoutTheDatabaseTest(StopTestCase):
    """The database goes away mid-turn: the stop still ends the turn and its skill and answers."""

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.outage = await FlakyStore.open(self.dsn, self.chain)
        self.addAsyncCleanup(self.outage.store.close)
        self.monitor = DatabaseMonitor(self.outage.store, lambda why: None, limit=3600, first_delay=0.05,
                                       max_delay=0.05)
        self.use(self.build(store=self.outage.store, llm=self.model, channels=[self.wechat], primary=self.wechat,
                            monitor=self.monitor))
        self.addAsyncCleanup(self.router.cancel)
        self.watching = asyncio.create_task(self.monitor.run())
        self.addAsyncCleanup(self.stop_watching)

    async def stop_watching(self):
        self.watching.cancel()
        await asyncio.gather(self.watching, return_exceptions=True)

    async def test_a_stop_in_an_outage_cancels_and_answers(self):
        turn, pgid = await self.napping()
        self.outage.lose()
        await self.deliver("停止")
        await self.gone(pgid)
        self.assertEqual(self.replies(), [STOPPED])     # on the channel directly
        self.assertEqual(len(self.model.bodies), 1)
        self.outage.restore()                           # the stopped turn's end is written once it is back
        await asyncio.wait_for(turn, 10)
        await self.gate.drain(5)
        self.assertEqual(self.replies(), [STOPPED])
        self.assertEqual(self.sql("SELECT decision FROM audit_log WHERE event = 'skill_finished'"), [("cancelled",)])
        self.assertEqual([m["content"] for m in await self.store.recent_messages("owner", 10)], ["睡一分钟", STOPPED])
        self.assertEqual(await self.store.pending_inbound(), [])

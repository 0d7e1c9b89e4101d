"""The router: /commands, approval replies before the model, stray codes, a lost database, per-user order."""
import asyncio
import io
import json
import random
import re
from datetime import datetime, timezone
from unittest import mock

from ias import approval
from ias.slash import HELP
from ias.channels.base import Inbound
from ias.channels.console import ConsoleChannel
from ias.llm import LLM
from ias.monitor import DatabaseMonitor
from ias.limits import INBOUND_REPLAYS_MAX
from ias.router import DB_DOWN, HELD, NOTHING_PENDING
from ias.store import Store
from tests.servers import closed_port
from tests.servers.llm import LLMServer, calls, stall, text
from tests.support import CODE_LINE, FIXTURES, FakeChannel, FakeClock, FlakyStore, GateTestCase, granted, until


class RouterTestCase(GateTestCase):
    system_skills = FIXTURES / "gate"
    user_skills = FIXTURES / "router"

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01,))
        self.wechat, self.console = FakeChannel("wechat"), FakeChannel("console")
        self.use(self.build(llm=self.llm, channels=[self.console, self.wechat], primary=self.wechat))

    async def asyncTearDown(self):
        await self.router.cancel()
        await self.llm.close()
        await asyncio.to_thread(self.server.__exit__)
        await super().asyncTearDown()

    def deliver(self, text: str, user: str = "owner", channel: str = "wechat") -> asyncio.Task:
        """A message arriving on `channel`, handled in the background as the channels do."""
        return asyncio.create_task(self.router.deliver(Inbound(channel, user, text)))


class CommandTest(RouterTestCase):
    async def test_commands_answer_on_the_channel_they_came_from_without_the_model(self):
        await self.deliver("/help", channel="console")
        self.assertEqual(self.console.sent, [("owner", HELP)])
        await self.deliver("/skills")
        [(_, listing)] = self.wechat.sent
        self.assertIn("echo_low（低风险）", listing)
        self.assertIn("mark_high（高风险）", listing)
        self.assertIn("wait_low（低风险）", listing)
        await self.deliver('/run echo_low {"text": "hey"}')
        self.assertEqual(json.loads(self.wechat.sent[-1][1]), {"success": True, "output": "hey"})
        self.assertEqual(self.server.requests, [])

    async def test_reset_forgets_the_history(self):
        await self.store.append_messages("owner", [{"role": "user", "content": "旧话"}])
        await self.store.append_messages("other", [{"role": "user", "content": "别人的话"}])
        await self.deliver("/reset")
        self.assertEqual(self.wechat.sent, [("owner", "对话记录已清空。")])
        self.assertEqual(await self.store.recent_messages("owner", 10), [])
        self.assertEqual(len(await self.store.recent_messages("other", 10)), 1)

    def test_the_primary_channel_is_the_one_named(self):
        self.assertIs(self.router.primary, self.wechat)       # not the first channel given
        with self.assertRaises(ValueError):
            self.build(channels=[self.console], primary=self.wechat)
        with self.assertRaises(ValueError):
            self.build(channels=[self.console])


class ApprovalReplyTest(RouterTestCase):
    async def test_the_code_goes_to_the_approval_and_never_to_the_model(self):
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), text("标好了。"))
        turn = self.deliver("请标记")
        code = CODE_LINE.search(await self.wechat.wait_for("确认码：")).group(1)
        await self.deliver("随便说点什么")                # while pending: answered by the approval
        self.assertIn("请回复 6 位确认码", self.wechat.sent[-1][1])
        await self.deliver(code)
        self.assertIn(("owner", "已确认，正在执行：mark_high"), self.wechat.sent)
        await turn
        self.assertEqual(self.wechat.sent[-1], ("owner", "标好了。"))
        self.assertEqual(self.runs(), 1)
        self.assertEqual(len(self.server.requests), 2)
        for raw in self.server.raw:
            self.assertNotIn(code.encode(), raw)
            self.assertNotIn("随便说点什么".encode(), raw)
        history = json.dumps(await self.store.recent_messages("owner", 50), ensure_ascii=False)
        self.assertNotIn(code, history)

    async def test_the_skill_asked_about_is_passed_as_data_not_read_back_from_the_message(self):
        # Issue 23: the router took the skill's name from the first `技能：` line of the rendered message.
        render = approval.render

        def misleading(*args, **kwargs) -> str:
            return "技能：echo_low\n" + render(*args, **kwargs)
        named = []
        urgent = self.router.outbox.urgent

        async def recording(user_id, channel, message, name, timeout):
            named.append(name)
            return await urgent(user_id, channel, message, name, timeout)
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), text("标好了。"))
        with mock.patch.object(approval, "render", misleading), \
                mock.patch.object(self.router.outbox, "urgent", recording):
            turn = self.deliver("请标记")
            code = CODE_LINE.search(await self.wechat.wait_for("确认码：")).group(1)
            await self.deliver(code)
            await turn
        self.assertEqual(named, ["mark_high"])
        self.assertIsNone(self.approvals.asking("owner"))       # asked about only while the approval waits
        self.assertEqual(self.runs(), 1)

    async def test_a_code_with_nothing_pending_is_intercepted(self):
        for reply in ("123456", " １２３４５６ "):
            await self.deliver(reply)
        self.assertEqual(self.wechat.sent, [("owner", NOTHING_PENDING)] * 2)
        self.assertEqual(self.server.requests, [])
        self.assertEqual(await self.store.recent_messages("owner", 10), [])


class DatabaseDownTest(RouterTestCase):
    """A database that goes away: a second store on the test's schema, pointed at a closed port and back."""

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.gone: list[str] = []
        self.outage = await FlakyStore.open(self.dsn, self.chain)
        self.flaky = self.outage.store
        self.addAsyncCleanup(self.flaky.close)
        self.monitor = DatabaseMonitor(self.flaky, self.gone.append, limit=3600, first_delay=0.05, max_delay=0.05)
        self.channel = FakeChannel("wechat")
        self.app = self.build(store=self.flaky, llm=self.llm, channels=[self.channel], primary=self.channel,
                              monitor=self.monitor)
        self.addAsyncCleanup(self.app.router.cancel)
        self.watching = asyncio.create_task(self.monitor.run())
        self.addAsyncCleanup(self.stop_watching)

    async def stop_watching(self):
        self.watching.cancel()
        await asyncio.gather(self.watching, return_exceptions=True)

    async def lose(self) -> None:
        self.outage.lose()

    def restore(self) -> None:
        self.outage.restore()

    def send(self, text: str) -> asyncio.Task:
        return asyncio.create_task(self.app.router.deliver(Inbound("wechat", "owner", text)))

    async def test_messages_in_an_outage_are_held_and_answered_in_order_when_it_returns(self):
        self.server.script(text("你好呀。"))
        await self.lose()
        lines = [self.send("你好"), self.send("/help")]
        await until(lambda: not self.monitor.available)
        await self.channel.wait_for(HELD)
        lines.append(self.send("/skills"))              # after the outage was noticed: held at once
        await asyncio.sleep(0.2)
        self.assertEqual(self.channel.sent, [("owner", HELD)])     # told once, no turn yet
        self.assertEqual(self.server.requests, [])
        self.restore()
        await asyncio.wait_for(asyncio.gather(*lines), 10)
        replies = [reply for _, reply in self.channel.sent]
        self.assertEqual(replies[:3], [HELD, "你好呀。", HELP])
        self.assertIn("echo_low（低风险）", replies[3])
        self.assertEqual(len(replies), 4)
        self.assertEqual([m["content"] for m in await self.store.recent_messages("owner", 10)], ["你好", "你好呀。"])
        self.assertEqual(await self.store.pending_inbound(), [])
        self.assertEqual(self.sql("SELECT text FROM inbound WHERE state = 'done' ORDER BY id"),
                         [("你好",), ("/help",), ("/skills",)])
        self.assertEqual(self.gone, [])

    async def test_a_reply_made_as_the_database_goes_is_kept_not_made_again(self):
        self.server.script(calls(("echo_low", {"text": "一次"})), text("你好呀。"))
        complete = self.llm.complete

        async def then_lose(*args, **kwargs):       # the outage comes as the model gives its last answer
            answer = await complete(*args, **kwargs)
            if not answer.tool_calls:
                await self.lose()
            return answer
        with mock.patch.object(self.llm, "complete", then_lose):
            line = self.send("你好")
            await until(lambda: not self.monitor.available)
            self.restore()
            await asyncio.wait_for(line, 10)
        self.assertEqual(self.channel.sent, [("owner", "你好呀。")])
        self.assertEqual(len(self.server.requests), 2)          # the turn was not run again
        self.assertEqual(self.sql("SELECT count(*) FROM audit_log WHERE event = 'skill_finished'"), [(1,)])
        self.assertEqual([m.get("content") for m in await self.store.recent_messages("owner", 10)][::3],
                         ["你好", "你好呀。"])
        self.assertEqual(await self.store.pending_inbound(), [])

    async def test_past_the_bound_a_message_gets_the_short_answer(self):
        await self.lose()
        first = self.send("/help")
        await until(lambda: not self.monitor.available)
        with mock.patch("ias.router.INBOUND_HELD_MAX", 1):
            second = self.send("/skills")               # held: the one place
            await until(lambda: self.app.router._held == 1)
            await self.send("/reset")                   # past the bound: answered and dropped
        self.assertEqual(self.channel.sent, [("owner", HELD), ("owner", DB_DOWN)])
        self.restore()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        self.assertEqual(self.channel.sent[2][1], HELP)
        self.assertIn("echo_low（低风险）", self.channel.sent[3][1])
        self.assertEqual(len(self.channel.sent), 4)

    async def test_a_code_sent_in_an_outage_is_applied_when_the_database_returns(self):
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), text("标好了。"))
        turn = self.send("请标记")
        code = CODE_LINE.search(await self.channel.wait_for("确认码：")).group(1)
        await self.lose()
        reply = self.send(code)                         # the statement fails: the outage is noticed
        await self.channel.wait_for(HELD)
        self.assertFalse(self.marker.exists())
        self.restore()
        await asyncio.wait_for(asyncio.gather(turn, reply), 10)
        self.assertIn(("owner", "已确认，正在执行：mark_high"), self.channel.sent)
        self.assertEqual(self.channel.sent[-1], ("owner", "标好了。"))
        self.assertEqual(self.runs(), 1)
        self.assertEqual(await self.store.pending_inbound(), [])

    async def test_a_code_held_past_the_approvals_time_is_not_applied(self):
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), text("没有标。"))
        clock = FakeClock(datetime(2026, 3, 2, tzinfo=timezone.utc))
        self.app.approvals.monotonic = clock.monotonic
        turn = self.send("请标记")
        code = CODE_LINE.search(await self.channel.wait_for("确认码：")).group(1)
        await self.lose()
        reply = self.send(code)
        await self.channel.wait_for(HELD)
        clock.seconds += self.app.approvals.timeout + 1      # the outage outlasted the approval's time
        self.restore()
        await asyncio.wait_for(reply, 10)
        self.assertNotIn(("owner", "已确认，正在执行：mark_high"), self.channel.sent)
        self.assertFalse(self.marker.exists())
        turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)

    async def test_without_a_monitor_a_lost_database_gets_the_short_answer(self):
        lost = Store(f"host=127.0.0.1 port={closed_port()} dbname=ias user=ias connect_timeout=2")
        channel = FakeChannel("wechat")
        router = self.build(store=lost, llm=self.llm, channels=[channel], primary=channel).router
        await router.deliver(Inbound("wechat", "owner", "/reset"))
        self.assertEqual(channel.sent, [("owner", DB_DOWN)])
        self.assertEqual(self.server.requests, [])


class ReplayTest(RouterTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.wechat.resumable = True        # its owner is still there after a restart (the console's is not)

    async def test_pending_messages_are_handled_first_in_order_and_once(self):
        for line in ("/help", "123456"):
            await self.store.record_inbound("wechat", "owner", None, line)
        done = await self.store.record_inbound("wechat", "owner", "m-1", "/skills")
        await self.store.finish_inbound(done)
        self.assertIsNone(await self.store.record_inbound("wechat", "owner", "m-1", "/skills"))    # seen
        self.assertEqual(await self.router.replay(), 2)
        await self.deliver("/reset")                    # new: after the replayed ones
        await until(lambda: len(self.wechat.sent) == 3)
        self.assertEqual([reply for _, reply in self.wechat.sent], [HELP, NOTHING_PENDING, "对话记录已清空。"])
        self.assertEqual(await self.store.pending_inbound(), [])
        self.assertEqual(await self.router.replay(), 0)

    async def test_a_console_line_is_forgotten_and_a_message_no_start_finishes_is_given_up(self):
        await self.store.record_inbound("console", "owner", None, "/help")
        stuck = await self.store.record_inbound("wechat", "owner", None, "让 iAs 崩溃的消息")
        self.sql("UPDATE inbound SET replays = %s WHERE id = %s", (INBOUND_REPLAYS_MAX, stuck))
        self.assertEqual(await self.router.replay(), 0)
        self.assertEqual(self.console.sent, [])
        self.assertEqual(self.wechat.sent, [("owner", f"iAs 重启了 {INBOUND_REPLAYS_MAX} 次仍未处理完这条消息，已跳过：让 iAs 崩溃的消息")])
        self.assertEqual(await self.store.pending_inbound(), [])

    async def test_each_replay_is_counted(self):
        await self.store.record_inbound("wechat", "owner", None, "/help")
        await self.store.count_replays([row.id for row in await self.store.pending_inbound()])
        [row] = await self.store.pending_inbound()
        self.assertEqual(row.replays, 1)

    async def test_a_cancelled_turn_stays_pending(self):
        self.server.script(stall())
        turn = self.deliver("想一想")
        await until(lambda: self.server.requests)
        await self.router.cancel()
        await asyncio.gather(turn, return_exceptions=True)
        [row] = await self.store.pending_inbound()
        self.assertEqual((row.user_id, row.text), ("owner", "想一想"))


class OrderTest(RouterTestCase):
    def jitter(self, *names: str) -> None:
        """Make the store's `names` take a random few milliseconds, as under load, so that a later message
        could finish what it looks up first before an earlier one."""
        pace = random.Random(20)
        for name in names:
            method = getattr(self.store, name)

            async def slowed(*args, method=method, **kwargs):
                await asyncio.sleep(pace.uniform(0, 0.004))
                return await method(*args, **kwargs)
            setattr(self.store, name, slowed)

    def replies(self, user: str = "owner") -> list[str]:
        return [reply for to, reply in self.wechat.sent if to == user]

    async def test_two_lines_typed_back_to_back_are_handled_in_the_order_they_came(self):
        self.jitter("queued", "enqueue")
        for i in range(50):
            lines = [self.deliver(f'/run echo_low {{"text": "{i}-{n}"}}') for n in (1, 2)]
            await asyncio.gather(*lines)
            outputs = [json.loads(reply)["output"] for reply in self.replies()[-2:]]
            self.assertEqual(outputs, [f"{i}-1", f"{i}-2"], f"round {i}")

    async def test_lines_typed_on_the_console_are_answered_in_the_order_typed(self):
        self.jitter("queued", "enqueue")
        lines = "".join(f'/run echo_low {{"text": "{i}"}}\n' for i in range(30))
        stdout = io.StringIO()
        console = ConsoleChannel("owner", stdin=io.StringIO(lines), stdout=stdout, interactive=False)
        router = self.build(channels=[console], primary=console).router
        self.addAsyncCleanup(router.cancel)
        await console.start(router.deliver)          # a thread hands each line to the loop, none awaited
        await until(lambda: stdout.getvalue().count('"output"') == 30, 60)     # 30 skill runs: slow under load
        outputs = re.findall(r'"output": "(\d+)"', stdout.getvalue())
        self.assertEqual(outputs, [str(i) for i in range(30)])

    async def test_free_text_commands_and_codes_alike_are_answered_in_order(self):
        self.jitter("queued", "enqueue")
        for i in range(10):
            self.server.script(text(f"第 {i} 句回答。"))
            lines = [self.deliver(line) for line in (f"第 {i} 句话", "/help", "123456")]
            await asyncio.gather(*lines)
            self.assertEqual(self.replies()[-3:], [f"第 {i} 句回答。", HELP, NOTHING_PENDING], f"round {i}")
        self.assertNotIn("123456", json.dumps(self.server.requests))

    async def test_a_code_reaches_the_approval_a_turn_waits_for_with_more_turns_queued_behind_it(self):
        self.jitter("queued", "enqueue")
        pidfile, wake = granted("pid"), granted("wake")
        first = self.deliver(f'/run wait_low {json.dumps({"pidfile": str(pidfile), "wake": str(wake)})}')
        await until(pidfile.exists)
        second = self.deliver(f'/run mark_high {json.dumps({"marker": str(self.marker)})}')
        third = self.deliver("/help")                   # queued behind the turn that will wait for the code
        wake.touch()
        code = CODE_LINE.search(await self.wechat.wait_for("确认码：")).group(1)
        await self.deliver(code)                        # while both later turns hold or wait for the turn lock
        await asyncio.gather(first, second, third)
        replies = self.replies()
        self.assertEqual(json.loads(replies[0]), {"success": True, "output": "woke\n"})
        self.assertIn("确认码：", replies[1])
        self.assertEqual(replies[2], "已确认，正在执行：mark_high")
        self.assertEqual(json.loads(replies[3]), {"success": True, "note": "none"})
        self.assertEqual(replies[4:], [HELP])
        self.assertEqual(self.runs(), 1)

    async def test_one_turn_at_a_time_per_user_and_users_do_not_wait_for_each_other(self):
        pidfile, wake = granted("pid"), granted("wake")
        first = self.deliver(f'/run wait_low {json.dumps({"pidfile": str(pidfile), "wake": str(wake)})}')
        await until(pidfile.exists)
        second = self.deliver("/help")                  # the owner again: waits for the first turn
        await self.deliver("/help", user="guest")        # someone else: answered at once
        await self.deliver("123456", user="guest")       # their stray code too (it waits for their turns only)
        self.assertEqual(self.wechat.sent, [("guest", HELP), ("guest", NOTHING_PENDING)])
        self.assertEqual(self.router.users_in_turn, 1)
        wake.touch()
        await asyncio.gather(first, second)
        owner = [reply for user, reply in self.wechat.sent if user == "owner"]
        self.assertEqual([json.loads(owner[0]), owner[1]], [{"success": True, "output": "woke\n"}, HELP])
        self.assertEqual(self.router.users_in_turn, 0)      # nobody's lock is kept once their turns end


class ShutdownTest(RouterTestCase):
    async def test_cancelling_leaves_no_line_behind(self):
        pidfile, wake = granted("pid"), granted("wake")
        first = self.deliver(f'/run wait_low {json.dumps({"pidfile": str(pidfile), "wake": str(wake)})}')
        await until(pidfile.exists)
        queued = [self.deliver(line) for line in ("/help", "123456", "/skills")]
        await until(lambda: self.router.dispatching == 4)
        await self.router.cancel()
        wake.touch()                                   # in case the skill outlived its turn
        await asyncio.gather(first, *queued)
        self.assertEqual(self.router.users_in_turn, 0)
        await self.deliver("/help")                    # no place left behind holds the owner up
        self.assertEqual(self.wechat.sent, [("owner", HELP)])

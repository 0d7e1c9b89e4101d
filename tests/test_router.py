"""The router: /commands, approval replies before the model, stray codes, a lost database, per-user order."""
import asyncio
import io
import json
import random
import re

from ias.agent import HELP
from ias.channels.base import Inbound
from ias.channels.console import ConsoleChannel
from ias.llm import LLM
from ias.monitor import DatabaseMonitor
from ias.router import DB_DOWN, NOTHING_PENDING
from ias.store import Store
from tests.servers import closed_port
from tests.servers.llm import LLMServer, calls, text
from tests.support import CODE_LINE, FIXTURES, FakeChannel, GateTestCase, granted, until


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

    async def test_a_code_with_nothing_pending_is_intercepted(self):
        for reply in ("123456", " １２３４５６ "):
            await self.deliver(reply)
        self.assertEqual(self.wechat.sent, [("owner", NOTHING_PENDING)] * 2)
        self.assertEqual(self.server.requests, [])
        self.assertEqual(await self.store.recent_messages("owner", 10), [])


class DatabaseDownTest(RouterTestCase):
    async def test_a_lost_database_gets_one_short_answer_and_no_turn(self):
        gone: list[str] = []
        lost = Store(f"host=127.0.0.1 port={closed_port()} dbname=ias user=ias connect_timeout=2")
        monitor = DatabaseMonitor(lost, gone.append, limit=3600, first_delay=3600)
        channel = FakeChannel("wechat")
        router = self.build(store=lost, llm=self.llm, channels=[channel], primary=channel, monitor=monitor).router
        watching = asyncio.create_task(monitor.run())
        try:
            await router.deliver(Inbound("wechat", "owner", "/reset"))      # the statement fails: suspected
            self.assertEqual(channel.sent, [("owner", DB_DOWN)])
            await until(lambda: not monitor.available)
            await router.deliver(Inbound("wechat", "owner", "你好"))      # unavailable: no turn at all
            self.assertEqual(channel.sent, [("owner", DB_DOWN)] * 2)
            self.assertEqual(self.server.requests, [])
            self.assertEqual(gone, [])
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


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
        await until(lambda: stdout.getvalue().count('"output"') == 30)
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

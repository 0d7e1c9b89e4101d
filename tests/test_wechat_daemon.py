"""WeChat end to end: a turn with a High skill confirmed from WeChat, and daemon restarts (one mid-turn)."""
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import psycopg

from ias.slash import HELP
from ias.channels.wechat.channel import WeChatChannel
from ias.channels.wechat.ilink import Credentials
from ias.llm import LLM
from ias.monitor import DatabaseMonitor
from ias.router import HELD
from tests.servers.ilink import ILinkServer
from tests.servers.llm import LLMServer, calls, stall, text
from tests.support import FIXTURES, REPO, FlakyStore, GateTestCase, drop_schema, fresh_schema_dsn, granted, slow, until


class WeChatTurnTest(GateTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.ilink = ILinkServer(hold=0.5).start()
        self.llm_server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.llm_server.base_url, "test-model", retry_delays=(0.01,))
        self.channel = WeChatChannel(self.store, Credentials(self.ilink.token, self.ilink.base_url, self.ilink.bot_id,
                                                             self.ilink.owner), retry_delay=0.05, backoff_delay=0.1)
        self.use(self.build(llm=self.llm, channels=[self.channel], primary=self.channel))
        await self.channel.start(self.router.deliver)

    async def asyncTearDown(self):
        await self.channel.stop()
        await self.router.cancel()
        await self.llm.close()
        await asyncio.to_thread(self.llm_server.__exit__)
        await asyncio.to_thread(self.ilink.close)
        await super().asyncTearDown()

    async def test_high_skill_confirmed_over_wechat(self):
        owner = self.ilink.owner
        self.llm_server.script(calls(("mark_high", {"marker": str(self.marker), "note": "微信"})), text("已经标记好了。"))
        self.ilink.message("帮我标记一下", context_token="ctx-ask")
        await until(lambda: any("确认码：" in m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent))
        [ask] = self.ilink.sent
        self.assertEqual((ask["to_user_id"], ask["context_token"]), (owner, "ctx-ask"))
        code = re.search(r"确认码：(\d{6})", ask["item_list"][0]["text_item"]["text"]).group(1)
        self.ilink.message(code, context_token="ctx-code")
        await until(lambda: any(m["item_list"][0]["text_item"]["text"] == "已经标记好了。" for m in self.ilink.sent))
        self.assertEqual(self.runs(), 1)
        final = self.ilink.sent[-1]
        self.assertEqual((final["to_user_id"], final["context_token"]), (owner, "ctx-code"))
        self.assertEqual(len({m["client_id"] for m in self.ilink.sent}), len(self.ilink.sent))
        self.assertEqual(self.ilink.problems, [])
        for raw in self.llm_server.raw:
            self.assertNotIn(code.encode(), raw)

    async def test_other_users_are_not_served(self):
        self.ilink.message("你好", sender="stranger@im.wechat")
        self.ilink.message("/help")
        await until(lambda: self.ilink.sent)     # the stranger's message came first: already dropped by then
        self.assertEqual([m["to_user_id"] for m in self.ilink.sent], [self.ilink.owner])
        self.assertEqual(self.llm_server.requests, [])


class WeChatOutageTest(GateTestCase):
    """The database goes away while the owner writes on WeChat (a second store on the test's schema,
    pointed at a closed port and back)."""

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.ilink = ILinkServer(hold=0.3).start()
        self.llm_server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.llm_server.base_url, "test-model", retry_delays=(0.01,))
        self.outage = await FlakyStore.open(self.dsn, self.chain)
        self.flaky = self.outage.store
        self.gone: list[str] = []
        self.monitor = DatabaseMonitor(self.flaky, self.gone.append, limit=3600, first_delay=0.05, max_delay=0.05)
        self.watching = asyncio.create_task(self.monitor.run())
        self.channel = WeChatChannel(self.flaky, Credentials(self.ilink.token, self.ilink.base_url, self.ilink.bot_id,
                                                             self.ilink.owner), retry_delay=0.05, backoff_delay=0.1)
        self.use(self.build(store=self.flaky, llm=self.llm, channels=[self.channel], primary=self.channel,
                            monitor=self.monitor))
        await self.channel.start(self.router.deliver)

    async def asyncTearDown(self):
        await self.channel.stop()
        await self.router.cancel()
        self.watching.cancel()
        await asyncio.gather(self.watching, return_exceptions=True)
        await self.flaky.close()
        await self.llm.close()
        await asyncio.to_thread(self.llm_server.__exit__)
        await asyncio.to_thread(self.ilink.close)
        await super().asyncTearDown()

    def texts(self) -> list[str]:
        return [m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent]

    async def test_a_message_in_an_outage_is_held_told_once_and_answered_once_when_it_returns(self):
        self.ilink.message("/help")
        await until(lambda: self.texts() == [HELP])
        self.outage.lose()
        self.llm_server.script(text("你好呀。"))
        self.ilink.message("你好")
        await until(lambda: HELD in self.texts())
        polls = len(self.ilink.calls("/ilink/bot/getupdates"))
        await until(lambda: len(self.ilink.calls("/ilink/bot/getupdates")) > polls + 2)    # given again and again
        self.assertEqual(self.texts(), [HELP, HELD])
        self.outage.restore()
        await until(lambda: "你好呀。" in self.texts())
        await until(lambda: self.ilink.calls("/ilink/bot/getupdates")[-1].body["get_updates_buf"] == "buf-2")
        await until(lambda: not self.router.dispatching)
        self.assertEqual(self.texts(), [HELP, HELD, "你好呀。"])
        self.assertEqual(len(self.llm_server.requests), 1)
        self.assertEqual(await self.store.pending_inbound(), [])
        self.assertEqual(self.gone, [])


@slow
class WeChatDaemonRestartTest(unittest.TestCase):
    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-wx-"))
        self.ilink = ILinkServer(hold=0.5).start()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_"))}
        self.env.update({"IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp),
                         "IAS_SKILLS_DIR": str(FIXTURES / "gate"), "IAS_WECHAT_TOKEN": self.ilink.token,
                         "IAS_WECHAT_OWNER": self.ilink.owner, "IAS_WECHAT_BASE_URL": self.ilink.base_url})

    def tearDown(self):
        self.ilink.close()
        drop_schema(self.schema_name)
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def daemon(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(REPO / "ias.py")], env=self.env, cwd=self.tmp,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_sent(self, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ilink.sent) < count:
            self.assertLess(time.monotonic(), deadline, f"only {len(self.ilink.sent)} sent")
            time.sleep(0.05)

    def stop(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0, proc.stderr.read())
        proc.stderr.close()

    def test_once_asks_for_confirmation_over_wechat(self):
        marker = granted("m")
        self.ilink.message("/help")                   # the owner wrote recently: inside the 24-hour window
        with LLMServer([calls(("mark_high", {"marker": str(marker), "note": "once"})), text("标记完成。")]) as llm:
            proc = subprocess.Popen([sys.executable, str(REPO / "ias.py"), "--once", "标记一下"],
                                    env={**self.env, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": llm.base_url},
                                    cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 20
                while not any("确认码：" in m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent):
                    self.assertLess(time.monotonic(), deadline, self.ilink.sent)
                    time.sleep(0.05)
                ask = next(m for m in self.ilink.sent if "确认码：" in m["item_list"][0]["text_item"]["text"])
                code = re.search(r"确认码：(\d{6})", ask["item_list"][0]["text_item"]["text"]).group(1)
                self.ilink.message(code)
                out, err = proc.communicate(timeout=20)
            finally:
                proc.kill()
        self.assertEqual((proc.returncode, out), (0, "标记完成。\n"), err)
        self.assertEqual(marker.read_text(), "once\n")
        self.assertNotIn(code, out + err)
        with psycopg.connect(self.dsn) as conn:       # answered by the command: not replayed by the next daemon
            self.assertEqual(conn.execute("SELECT count(*) FROM inbound WHERE state = 'pending'").fetchone(), (0,))

    def test_restart_resumes_from_cursor_and_never_handles_a_message_twice(self):
        first = self.daemon()
        handled = self.ilink.message("/help")
        self.wait_sent(1)
        self.assertIn("/reset", self.ilink.sent[0]["item_list"][0]["text_item"]["text"])
        self.stop(first)
        polls_before = len(self.ilink.calls("/ilink/bot/getupdates"))

        self.ilink.redeliver(handled)              # the service sends the same message again
        self.ilink.message("/skills")
        second = self.daemon()
        self.wait_sent(2)       # the duplicate came before /skills in the stream: it was judged by then
        self.stop(second)
        texts = [m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent]
        self.assertEqual(len(texts), 2, texts)
        self.assertIn("mark_high（高风险）", texts[1])
        resumed = self.ilink.calls("/ilink/bot/getupdates")[polls_before]
        self.assertEqual(resumed.body["get_updates_buf"], "buf-1")          # the stored cursor
        self.assertEqual(self.ilink.problems, [])

    def test_sigterm_while_a_reply_is_being_sent_waits_for_its_mark_and_never_sends_it_again(self):
        first = self.daemon()
        self.ilink.send_replies = [{"ret": 0, "hold": 2.0}]      # the reply lands; its answer comes 2 s later
        self.ilink.message("/help")
        self.wait_sent(1)
        self.stop(first)                                        # SIGTERM between the post and its mark
        with psycopg.connect(self.dsn) as conn:
            states = conn.execute("SELECT state, client_id FROM outbox").fetchall()
        self.assertEqual(states, [("sent", self.ilink.sent[0]["client_id"])])

        second = self.daemon()
        self.ilink.message("/skills")
        self.wait_sent(2)
        self.stop(second)
        texts = [m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent]
        self.assertEqual(len(texts), 2, texts)
        self.assertIn("/reset", texts[0])
        self.assertIn("mark_high（高风险）", texts[1])
        self.assertEqual(self.ilink.problems, [])

    def test_sigterm_mid_turn_loses_nothing_and_the_restart_answers_both_once_in_order(self):
        """The attacker's reproducer: SIGTERM while the model is still thinking about the first message,
        with a second queued behind it. Both are answered after the restart, once each, in order."""
        with LLMServer([stall(), text("答一"), text("答二")]) as llm:
            self.env.update({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": llm.base_url})
            first = self.daemon()
            one = self.ilink.message("第一句")
            self.wait_until(lambda: llm.requests)                       # the model is thinking about it
            self.ilink.message("第二句")
            self.wait_until(lambda: self.cursor() == "buf-2")            # the second was taken in too
            self.stop(first)
            self.assertEqual(self.ilink.sent, [])
            self.assertEqual(self.sql("SELECT text, state FROM inbound ORDER BY id"),
                             [("第一句", "pending"), ("第二句", "pending")])

            self.ilink.redeliver(one)              # and the service gives the first one again
            second = self.daemon()
            self.wait_sent(2)
            self.wait_until(lambda: self.sql("SELECT count(*) FROM inbound WHERE state = 'pending'") == [(0,)])
            self.stop(second)
            self.assertEqual(len(llm.requests), 3)      # the stalled request, then one per message
        self.assertEqual([m["item_list"][0]["text_item"]["text"] for m in self.ilink.sent], ["答一", "答二"])
        history = self.sql("SELECT message->>'role', message->>'content' FROM messages ORDER BY id")
        self.assertEqual(history, [("user", "第一句"), ("assistant", "答一"), ("user", "第二句"), ("assistant", "答二")])
        self.assertEqual(self.sql("SELECT text, state FROM inbound ORDER BY id"),
                         [("第一句", "done"), ("第二句", "done")])
        self.assertEqual(self.ilink.problems, [])

    def cursor(self) -> str | None:
        """The cursor the daemon's latest long poll carried."""
        polls = self.ilink.calls("/ilink/bot/getupdates")
        return polls[-1].body.get("get_updates_buf") if polls else None

    def wait_until(self, condition, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.assertLess(time.monotonic(), deadline, "timed out")
            time.sleep(0.05)

    def sql(self, query: str) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query).fetchall()


if __name__ == "__main__":
    unittest.main()

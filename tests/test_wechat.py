"""The WeChat channel and login against the local iLink server (tests/servers/ilink.py)."""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone

from ias import limits
from ias.channels.base import Inbound
from ias.channels.wechat.channel import BUDGET_NOTE, MEDIA_ONLY, STALE_NOTE, WeChatChannel
from ias.errors import ConfigError
from ias.channels.wechat.ilink import CHANNEL, Credentials, WeChatError
from ias.channels.wechat.login import credentials, login, logout, redirect_url, status
from tests.servers.ilink import ILinkServer
from tests.support import FIXTURES, REPO, FakeClock, StoreTestCase, slow

HOUR = 3600.0


class WeChatTestCase(StoreTestCase):
    hold = 1.0

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.server = ILinkServer(hold=self.hold).start()
        self.clock = FakeClock(datetime.fromtimestamp(1_700_000_000, timezone.utc))
        self.delivered: list[Inbound] = []
        self.channels: list[WeChatChannel] = []

    async def asyncTearDown(self) -> None:
        for channel in self.channels:
            await channel.stop()
        self.server.close()
        await super().asyncTearDown()
        self.assertEqual(self.server.problems, [])

    def credentials(self) -> Credentials:
        return Credentials(self.server.token, self.server.base_url, self.server.bot_id, self.server.owner)

    async def channel(self, **options) -> WeChatChannel:
        options.setdefault("retry_delay", 0.05)
        options.setdefault("backoff_delay", 0.5)
        channel = WeChatChannel(self.store, self.credentials(), now=self.clock.timestamp, **options)
        self.channels.append(channel)
        await channel.start(self.deliver)
        return channel

    async def deliver(self, message: Inbound) -> None:
        self.delivered.append(message)

    async def until(self, condition, timeout: float = 5.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    def polls(self) -> list:
        return self.server.calls("/ilink/bot/getupdates")

    async def inbound(self, text: str = "你好", **fields) -> dict:
        """Queue an owner message and wait until the channel delivered it."""
        count = len(self.delivered)
        msg = self.server.message(text, **fields)
        await self.until(lambda: len(self.delivered) > count, what="delivery")
        return msg


class LoginTest(WeChatTestCase):
    hold = 0.3

    async def run_login(self, steps: list[dict], answers: list[str] = (), server: ILinkServer | None = None, **options):
        self.server.login.extend(steps)
        self.out: list[str] = []
        self.prompts: list[str] = []
        answers = list(answers)

        async def ask(prompt: str) -> str:
            self.prompts.append(prompt)
            return answers.pop(0)
        options.setdefault("pause", 0.01)
        return await login(self.store, (server or self.server).base_url, out=self.out.append, ask=ask, **options)

    async def test_login_with_verify_code_persists_credentials_and_drops_old_state(self):
        await self.store.set_state(CHANNEL, "cursor", "buf-old")
        await self.store.set_state(CHANNEL, "peer:someone", {"context_token": "old"})
        result = await self.run_login([{"status": "wait"}, {"status": "scaned"},
                                       {"status": "need_verifycode", "code": "4711"}, {"status": "confirmed"}],
                                      answers=["1234", "4711"])
        self.assertEqual(result, {"base_url": self.server.base_url, "bot_id": self.server.bot_id,
                                  "owner": self.server.owner})
        self.assertEqual(await self.store.get_state(CHANNEL, "token"), self.server.token)
        self.assertEqual(await self.store.get_state(CHANNEL, "owner"), self.server.owner)
        self.assertEqual(await self.store.get_state(CHANNEL, "base_url"), self.server.base_url)
        self.assertEqual(await self.store.get_state(CHANNEL, "bot_id"), self.server.bot_id)
        self.assertIsNone(await self.store.get_state(CHANNEL, "cursor"))
        self.assertIsNone(await self.store.get_state(CHANNEL, "peer:someone"))
        codes = [r.query.get("verify_code") for r in self.server.calls("/ilink/bot/get_qrcode_status")]
        self.assertEqual(codes, [None, None, None, "1234", "4711"])
        self.assertEqual(len(self.prompts), 2)
        self.assertIn("验证码不正确", self.prompts[1])
        text = "\n".join(self.out)
        self.assertIn("https://liteapp.weixin.qq.com/q/", text)
        self.assertIn("扫描", text)
        self.assertIn("请在手机微信上确认", text)
        self.assertIn("登录成功", text)
        self.assertNotIn(self.server.token, text)

    async def test_expired_code_is_replaced_and_gives_up_after_the_limit(self):
        await self.run_login([{"status": "expired"}, {"status": "expired"}, {"status": "confirmed"}])
        self.assertEqual(len(self.server.qrcodes), 3)
        polled = [r.query["qrcode"] for r in self.server.calls("/ilink/bot/get_qrcode_status")]
        self.assertEqual(polled, self.server.qrcodes)            # each poll asked about the newest code
        self.assertEqual(sum("二维码已过期" in line for line in self.out), 2)

        await logout(self.store)
        self.server.login.clear()
        with self.assertRaises(WeChatError) as caught:
            await self.run_login([{"status": "expired"}] * limits.WECHAT_QR_CODES_MAX)
        self.assertIn("过期", str(caught.exception))
        self.assertIsNone(await self.store.get_state(CHANNEL, "token"))

    async def test_redirect_continues_polling_at_the_new_host(self):
        with ILinkServer(hold=0.3) as other:
            other.login.append({"status": "confirmed", "baseurl": None, "ilink_user_id": "o9cq-redirected@im.wechat"})
            result = await self.run_login([{"status": "scaned"},
                                           {"status": "scaned_but_redirect", "redirect_host": other.host}])
            self.assertEqual([r.query["qrcode"] for r in other.calls("/ilink/bot/get_qrcode_status")],
                             self.server.qrcodes)
            self.assertEqual(other.problems, [])
        self.assertEqual(result["owner"], "o9cq-redirected@im.wechat")
        self.assertEqual(result["base_url"], self.server.base_url)      # no baseurl returned: the one used
        self.assertEqual(redirect_url("https://ilinkai.weixin.qq.com", "sh.ilinkai.weixin.qq.com"),
                         "https://sh.ilinkai.weixin.qq.com")
        self.assertEqual(redirect_url("http://127.0.0.1:1", "http://127.0.0.1:2/"), "http://127.0.0.1:2")
        self.assertEqual(redirect_url("https://a.example", "http://b.example"), "https://b.example")

    async def test_blocked_and_already_bound_are_clear_errors(self):
        with self.assertRaises(WeChatError) as caught:
            await self.run_login([{"status": "need_verifycode", "code": "4711", "attempts": 2}], answers=["1", "2"])
        self.assertIn("验证码输错次数过多", str(caught.exception))
        with self.assertRaises(WeChatError) as caught:
            await self.run_login([{"status": "binded_redirect"}])
        self.assertIn("已经绑定", str(caught.exception))
        with self.assertRaises(WeChatError) as caught:             # redirected to a host that is not there
            await self.run_login([{"status": "scaned_but_redirect", "redirect_host": "127.0.0.1:1"}])
        self.assertIn("无法查询二维码状态", str(caught.exception))
        self.assertIsNone(await self.store.get_state(CHANNEL, "token"))

    async def test_client_timeout_counts_as_wait_and_the_flow_is_bounded(self):
        result = await self.run_login([{"status": "wait", "hold": 2.0}, {"status": "confirmed"}], poll_timeout=0.2)
        self.assertEqual(result["owner"], self.server.owner)
        await logout(self.store)
        started = time.monotonic()
        with self.assertRaises(WeChatError) as caught:
            await self.run_login([], poll_timeout=0.2, deadline=0.6)
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertIn("登录超时", str(caught.exception))


class LoginStateTest(WeChatTestCase):
    async def test_status_never_shows_the_token_and_logout_clears(self):
        self.assertFalse((await status(self.store)).logged_in)
        self.server.login.append({"status": "confirmed"})
        await login(self.store, self.server.base_url, out=lambda line: None, ask=lambda prompt: "", pause=0.01)
        channel = await self.channel()
        await self.inbound()
        await channel.stop()
        info = await status(self.store)
        self.assertTrue(info.logged_in)
        self.assertEqual((info.owner, info.bot_id, info.base_url),
                         (self.server.owner, self.server.bot_id, self.server.base_url))
        self.assertTrue(info.cursor)
        self.assertIsNotNone(info.last_inbound)
        self.assertFalse(info.stale)
        self.assertNotIn(self.server.token, json.dumps(asdict(info)))
        self.assertNotIn(self.server.token, repr(self.credentials()))
        await logout(self.store)
        info = await status(self.store)
        self.assertFalse(info.logged_in)
        self.assertFalse(info.cursor)
        self.assertIsNone(await credentials(self.store, None, None, None))

    async def test_credentials_from_the_environment_win(self):
        self.assertIsNone(await credentials(self.store, None, "o-env", None))
        creds = await credentials(self.store, "env-token", "o-env", "http://127.0.0.1:9/")
        self.assertEqual((creds.token, creds.owner, creds.base_url), ("env-token", "o-env", "http://127.0.0.1:9"))
        with self.assertRaises(ConfigError):
            await credentials(self.store, "env-token", None, None)
        self.server.login.append({"status": "confirmed"})
        await login(self.store, self.server.base_url, out=lambda line: None, ask=lambda prompt: "", pause=0.01)
        stored = await credentials(self.store, None, None, "https://ilinkai.weixin.qq.com")
        self.assertEqual(stored, self.credentials())                   # the login's own base URL
        creds = await credentials(self.store, "env-token", None, None)
        self.assertEqual((creds.token, creds.owner, creds.base_url),
                         ("env-token", self.server.owner, "https://ilinkai.weixin.qq.com"))

    @slow
    async def test_status_and_doctor_commands_read_the_stored_login(self):
        self.server.login.append({"status": "confirmed"})
        await login(self.store, self.server.base_url, out=lambda line: None, ask=lambda prompt: "", pause=0.01)
        with tempfile.TemporaryDirectory(prefix="ias-wechat-") as tmp:
            env = {key: value for key, value in os.environ.items() if not key.startswith(("IAS_", "OPENAI_"))}
            env.update(IAS_DATABASE_URL=self.dsn, IAS_DATA_DIR=tmp, IAS_SKILLS_DIR=str(FIXTURES / "gate"))

            async def ias(*args: str) -> str:
                done = await asyncio.to_thread(subprocess.run, [sys.executable, str(REPO / "ias.py"), *args],
                                               capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
                self.assertNotIn("Traceback", done.stderr)
                self.assertNotIn(self.server.token, done.stdout + done.stderr)
                return done.stdout
            shown = await ias("wechat", "status")
            self.assertEqual(shown.splitlines(), [
                "logged_in: True", f"base_url: {self.server.base_url}", f"bot_id: {self.server.bot_id}",
                f"owner: {self.server.owner}", "cursor: False", "last_inbound: None", "stale: False",
                "stale_since: None"])
            self.assertIn(f"ok    channel: WeChat, owner {self.server.owner}\n", await ias("doctor"))
            await self.store.set_state(CHANNEL, "stale", {"at": self.clock.timestamp(), "detail": "session timeout"})
            self.assertIn("FAIL  channel: WeChat session expired: run `ias wechat login`\n", await ias("doctor"))
            self.assertIn("stale: True\n", await ias("wechat", "status"))
            env["IAS_WECHAT_TOKEN"] = "env-token"
            self.assertEqual((await ias("wechat", "status")).splitlines()[-1],
                             "注意：已设置环境变量 IAS_WECHAT_TOKEN，它优先于本机保存的微信登录。")


class ReceiveTest(WeChatTestCase):
    async def test_long_poll_is_held_and_delivers_promptly(self):
        await self.channel()
        await self.until(lambda: len(self.polls()) >= 2, what="the second poll")
        first, second = [r.at for r in self.polls()[:2]]
        self.assertGreaterEqual(second - first, 0.9 * self.hold)          # held, not a busy loop
        started = time.monotonic()
        await self.inbound("今天天气怎么样")
        self.assertLess(time.monotonic() - started, 0.75)                 # did not wait for the hold to end
        self.assertEqual(self.delivered[-1].channel, "wechat")
        self.assertEqual(self.delivered[-1].user_id, self.server.owner)
        self.assertEqual(self.delivered[-1].text, "今天天气怎么样")
        await self.until(lambda: self.polls()[-1].body["get_updates_buf"] == "buf-1", what="the cursor sent back")
        self.assertEqual(await self.store.get_state(CHANNEL, "cursor"), "buf-1")

    async def test_restart_resumes_from_the_cursor_and_skips_handled_messages(self):
        channel = await self.channel()
        first = await self.inbound("第一条")
        await self.until(lambda: self.polls()[-1].body["get_updates_buf"] == "buf-1", what="cursor")
        await channel.stop()
        self.server.redeliver(first)
        self.server.message("第二条")
        polled = len(self.polls())
        await self.channel()
        await self.until(lambda: len(self.delivered) == 2, what="the second message")
        self.assertEqual(self.polls()[polled].body["get_updates_buf"], "buf-1")
        # The duplicate came before 第二条 in the stream: judged (and dropped) by the time 第二条 arrived.
        self.assertEqual([m.text for m in self.delivered], ["第一条", "第二条"])
        self.assertEqual(self.delivered[0].message_id, str(first["message_id"]))

    async def test_only_the_owners_user_messages_are_served(self):
        await self.channel()
        self.server.message("陌生人", sender="o-stranger@im.wechat")
        self.server.message("机器人自己的消息", message_type=2)
        twice = self.server.message("重复")
        self.server.redeliver(twice)
        self.server.message("主人")                 # the others came first: judged by the time it arrives
        await self.until(lambda: "主人" in [m.text for m in self.delivered], what="the owner's message")
        self.assertEqual([m.text for m in self.delivered], ["重复", "主人"])
        self.assertEqual(self.server.sent, [])

    async def test_voice_transcript_is_delivered_and_media_gets_a_note(self):
        await self.channel()
        await self.inbound(items=[{"type": 3, "voice_item": {"text": "提醒我八点开会"}}])
        self.assertEqual(self.delivered[-1].text, "提醒我八点开会")
        self.server.message(items=[{"type": 2, "image_item": {"url": "x"}}], context_token="ctx-image")
        self.server.message(items=[{"type": 3, "voice_item": {}}])
        await self.until(lambda: len(self.server.sent) == 2, what="the notes")
        self.assertEqual([m["item_list"][0]["text_item"]["text"] for m in self.server.sent], [MEDIA_ONLY] * 2)
        self.assertEqual(self.server.sent[0]["to_user_id"], self.server.owner)
        self.assertEqual(self.server.sent[0]["context_token"], "ctx-image")
        self.assertEqual(len(self.delivered), 1)

    async def test_transient_errors_are_retried_then_backed_off(self):
        self.server.updates.extend([{"http": 500}, {"ret": -1, "errmsg": "busy"}, {"errcode": -3}])
        await self.channel(retry_delay=0.05, backoff_delay=0.5)
        await self.until(lambda: len(self.polls()) >= 4, what="the fourth poll")
        at = [r.at for r in self.polls()]
        self.assertLess(at[1] - at[0], 0.4)
        self.assertLess(at[2] - at[1], 0.4)
        self.assertGreaterEqual(at[3] - at[2], 0.45)                     # three in a row: the long pause
        await self.inbound("恢复了")

    async def test_stale_session_stops_polling_and_tells_once(self):
        notes: list[str] = []

        async def on_stale(note: str) -> None:
            notes.append(note)
        self.server.stale = True
        channel = await self.channel(on_stale=on_stale)
        await self.until(lambda: notes, what="on_stale")
        await self.until(lambda: not channel.polling, what="the long poll to end")
        self.assertEqual(len(self.polls()), 1)
        self.assertEqual(notes, [STALE_NOTE])
        self.assertTrue(channel.stale)
        self.assertTrue((await status(self.store)).stale)
        self.assertFalse(await channel.send(self.server.owner, "还在吗"))
        self.assertEqual(self.server.calls("/ilink/bot/sendmessage"), [])

    async def test_stop_is_prompt_mid_poll(self):
        self.server.hold = 30.0
        channel = await self.channel()
        await self.until(lambda: self.polls(), what="the first poll")
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await channel.stop()
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertFalse(channel.polling)


class SendTest(WeChatTestCase):
    async def test_send_echoes_the_latest_context_token_with_unique_client_ids(self):
        await self.channel()
        await self.inbound("一", context_token="ctx-a")
        await self.inbound("二", context_token="ctx-b")
        self.assertTrue(await self.channels[0].send(self.server.owner, "收到"))
        self.assertTrue(await self.channels[0].send(self.server.owner, "再说一次"))
        sent = self.server.sent
        self.assertEqual([m["context_token"] for m in sent], ["ctx-b", "ctx-b"])
        self.assertEqual(len({m["client_id"] for m in sent}), 2)
        self.assertTrue(all(m["client_id"].startswith("ias-") for m in sent))
        self.assertEqual(sent[0]["item_list"], [{"type": 1, "text_item": {"text": "收到"}}])
        await self.channels[0].stop()
        restarted = WeChatChannel(self.store, self.credentials(), now=self.clock.timestamp)    # the token from the store
        self.assertTrue(await restarted.send(self.server.owner, "重启之后"))
        self.assertEqual(self.server.sent[-1]["context_token"], "ctx-b")

    async def test_refused_send_is_false(self):
        channel = await self.channel()
        await self.inbound()
        self.server.send_replies.append({"ret": -2, "errmsg": "rate limited"})
        self.assertFalse(await channel.send(self.server.owner, "被拒绝"))
        self.assertTrue(await channel.send(self.server.owner, "这次可以"))

    async def test_no_send_outside_the_24_hour_window(self):
        channel = await self.channel()
        self.assertFalse(await channel.send(self.server.owner, "还没有人说过话"))
        await self.inbound()
        self.clock.advance(22 * HOUR)
        self.assertTrue(await channel.send(self.server.owner, "二十二小时后"))
        self.clock.advance(1 * HOUR + 1)
        with self.assertLogs("ias.channels", "WARNING"):
            self.assertFalse(await channel.send(self.server.owner, "太晚了"))
        self.assertEqual(len(self.server.sent), 1)

    async def test_send_budget_per_owner_message(self):
        channel = await self.channel()
        await self.inbound()
        results = [await channel.send(self.server.owner, f"第{i}条") for i in range(1, 10)]
        self.assertEqual(results, [True] * 7 + [False, False])
        self.assertEqual(len(self.server.sent), limits.WECHAT_SEND_BUDGET)
        self.assertEqual(self.server.sent[-1]["item_list"][0]["text_item"]["text"], BUDGET_NOTE)
        await self.inbound("继续")
        self.assertTrue(await channel.send(self.server.owner, "又可以发了"))

"""The outbox against the local iLink server: a simulated week of reminders, a long reply continued
across restarts, a High call from a task while the window is shut, and the fallback notifiers
against local SMTP and webhook receivers."""
import asyncio
import io
import json
import re
import subprocess
import sys
from datetime import datetime, timedelta
from unittest import mock

from ias.channels.console import ConsoleChannel
from ias.channels.wechat.channel import BUDGET_NOTE, WeChatChannel
from ias import limits
from ias.config import mail_server
from ias.clock import TZ
from ias.channels.wechat.ilink import Credentials
from ias.llm import LLM
from ias.notifiers import Email, Fallback, Notice, WeComRobot, Webhook
from ias.outbox import BACKLOG_NOTE, IN_DOUBT, Outbox
from ias.scheduler import Scheduler, add_task
from tests.servers.ilink import ILinkServer
from tests.servers.llm import LLMServer, calls, stall, text
from tests.servers.mail import SMTPServer
from tests.servers.webhook import WebhookServer, WeComServer
from tests.support import REPO, FakeChannel, FakeClock, GateTestCase, capture_logs, slow, until

KEEPER = "回复任意内容，微信才允许我按时发送。"
DAY1 = datetime(2026, 3, 2, 5, 0, tzinfo=TZ)        # a Monday, Beijing time


def texts(server: ILinkServer) -> list[str]:
    return [m["item_list"][0]["text_item"]["text"] for m in server.sent]


class OutboxTestCase(GateTestCase):
    """A store, the local iLink server and a WeChat channel on a simulated clock, wired by app.build."""

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.ilink = ILinkServer(hold=0.3).start()
        self.hook = WebhookServer().start()
        self.clock = FakeClock(DAY1)
        self.channels: list[WeChatChannel] = []
        self.llm = None
        self.restart()

    def restart(self, fallback: Fallback | None = None, llm=None):
        """New channel, outbox and router over the same store: what a daemon restart builds."""
        self.channel = WeChatChannel(self.store, Credentials(self.ilink.token, self.ilink.base_url, self.ilink.bot_id,
                                                             self.ilink.owner),
                                     now=self.clock.timestamp, retry_delay=0.05, backoff_delay=0.1)
        self.channels.append(self.channel)
        self.fallback = fallback or Fallback([Webhook(self.hook.url)], retry_delay=0.01)
        self.use(self.build(llm=llm or self.llm, channels=[self.channel], primary=self.channel, now=self.clock.now,
                            fallback=self.fallback))
        self.outbox = self.app.outbox

    async def asyncTearDown(self):
        for channel in self.channels:
            await channel.stop()
        if self.router is not None:
            await self.router.cancel()
        await asyncio.to_thread(self.ilink.close)
        await asyncio.to_thread(self.hook.close)
        await super().asyncTearDown()
        self.assertEqual(self.ilink.problems, [])

    async def start(self):
        await self.channel.start(self.router.deliver)

    async def owner_writes(self, message: str, answers: int = 1):
        """The owner sends `message`; wait until `answers` more messages reached them."""
        count = len(self.ilink.sent)
        self.ilink.message(message)
        await until(lambda: len(self.ilink.sent) >= count + answers)
        await until(lambda: self.router.dispatching == 0)          # and its bookkeeping is done

    def fallback_texts(self) -> list[str]:
        return [body["text"] for body in self.hook.bodies()]


class SimulatedWeekTest(OutboxTestCase):
    async def test_a_daily_reminder_reaches_the_owner_exactly_once_every_day(self):
        task = await add_task(self.store, self.ilink.owner, "天气", "0 7 * * *", "reminder", "今天带伞", now=DAY1)
        scheduler = Scheduler(self.store, self.router.run_task, now=self.clock.now)
        await self.start()
        self.clock.at = DAY1 + timedelta(hours=1)                   # day 1, 06:00: the owner writes
        await self.owner_writes("/help")
        step = timedelta(minutes=10)
        while self.clock.at < DAY1 + timedelta(days=7):
            self.clock.at += step
            await asyncio.gather(*await scheduler.tick())
            local = self.clock.at.astimezone(TZ)
            if local.day == 5 and (local.hour, local.minute) == (7, 0):   # day 4, 07:00, after the reminder queued
                await self.owner_writes("/help", answers=2)               # the reminder, then the answer
            await self.outbox.tick()

        on_wechat = [t for t in texts(self.ilink) if t == "今天带伞"]
        by_fallback = [t for t in self.fallback_texts() if t == "今天带伞"]
        self.assertEqual((len(on_wechat), len(by_fallback)), (2, 5))          # days 1 and 4; 2, 3, 5, 6, 7
        runs = self.task_runs(task.id)
        self.assertEqual(len(runs), 7)
        self.assertEqual(sorted(r.delivery for r in runs), ["delivered"] * 2 + ["fallback"] * 5)
        asks = [t for t in texts(self.ilink) if KEEPER in t]
        self.assertEqual(asks, [f"今天 07:00 有提醒「天气」：{KEEPER}"] * 2)   # day 2 and day 5, 03:00 and 04:00
        self.assertEqual(self.outbox.keeper_asks, 2)
        self.assertEqual(await self.store.queued(), [])
        ids = [m["client_id"] for m in self.ilink.sent]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertEqual(len(self.hook.requests), 5)


class LongReplyTest(OutboxTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.llm_server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.llm_server.base_url, "test-model", retry_delays=(0.01,))
        self.restart()

    async def asyncTearDown(self):
        await super().asyncTearDown()
        await self.llm.close()
        await asyncio.to_thread(self.llm_server.__exit__)

    async def test_a_40000_character_reply_continues_when_the_owner_replies_and_survives_restarts(self):
        reply = "".join(chr(0x4E00 + i % 3001) for i in range(40_000))      # no two parts alike
        parts = [reply[i:i + 4000] for i in range(0, 40_000, 4000)]
        self.llm_server.script(text(reply))
        await self.start()
        await self.owner_writes("写一篇长文", answers=8)
        self.assertEqual(texts(self.ilink), parts[:7] + [BUDGET_NOTE])
        queued = await self.store.queued(self.ilink.owner)
        self.assertEqual([(row.text, row.reason) for row in queued], [(p, "budget") for p in parts[7:]])

        await self.channel.stop()                                   # the daemon restarts …
        self.restart()
        self.ilink.send_replies = [{"ret": 0}, {"ret": -1, "errmsg": "system busy"}]
        await self.start()
        await self.owner_writes("继续", answers=2)                  # … part 8 arrives, part 9 is refused
        await self.channel.stop()                                   # … and it restarts again
        self.restart()
        self.clock.at += timedelta(minutes=5)                       # past the retry delay
        await self.outbox.tick()

        accepted = [m for i, m in enumerate(self.ilink.sent) if i != 9]     # the 10th request was refused
        self.assertEqual([m["item_list"][0]["text_item"]["text"] for m in accepted], parts[:7] + [BUDGET_NOTE] + parts[7:])
        self.assertEqual(len({m["client_id"] for m in accepted}), len(accepted))
        self.assertEqual(self.ilink.sent[9]["client_id"], self.ilink.sent[10]["client_id"])   # the retry: same id
        self.assertEqual(await self.store.queued(), [])
        self.assertEqual(len(self.llm_server.requests), 1)          # 继续 only continued


class HeldConfirmationTest(OutboxTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.llm_server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.llm_server.base_url, "test-model", retry_delays=(0.01,))
        self.smtp = SMTPServer().__enter__()
        self.wecom = WeComServer().start()
        environ = {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_PORT": str(self.smtp.port), "IAS_SMTP_SSL": "none"}
        self.restart(Fallback([Email("me@example.com", mail_server("IAS_SMTP", environ)), WeComRobot(self.wecom.url), Webhook(self.hook.url)],
                              retry_delay=0.01))

    async def asyncTearDown(self):
        await super().asyncTearDown()
        await self.llm.close()
        await asyncio.to_thread(self.llm_server.__exit__)
        await asyncio.to_thread(self.smtp.__exit__)
        await asyncio.to_thread(self.wecom.close)
        self.assertEqual(self.wecom.problems, [])

    async def test_a_high_call_from_a_task_with_the_window_shut_waits_for_the_owner(self):
        await self.start()
        await self.owner_writes("/help")                            # day 1, 05:00
        self.clock.at = DAY1 + timedelta(days=2, hours=2)           # day 3, 07:00: the window shut long ago
        task = await add_task(self.store, self.ilink.owner, "标记", "0 7 * * *", "prompt", "做标记",
                              now=self.clock.at - timedelta(hours=1))
        self.llm_server.script(calls(("mark_high", {"marker": str(self.marker)})), text("标记好了。"))
        scheduler = Scheduler(self.store, self.router.run_task, now=self.clock.now)
        [run] = await scheduler.tick()
        notice = "有操作等待确认：mark_high。请在微信里回复任意内容查看确认码（1 分钟内有效）"
        await until(lambda: len(self.wecom.requests) == 1 and len(self.hook.requests) == 1 and self.smtp.messages)
        before = len(self.ilink.sent)

        self.ilink.message("在吗")                                  # the owner writes within the timeout
        await until(lambda: len(self.ilink.sent) > before)
        code = re.search(r"确认码：(\d{6})", texts(self.ilink)[-1]).group(1)
        self.ilink.message(code)
        await asyncio.wait_for(run, 10)
        await until(lambda: "标记好了。" in texts(self.ilink))
        self.assertEqual(self.runs(), 1)
        [row] = self.task_runs(task.id)
        self.assertEqual((row.status, row.delivery), ("ok", "delivered"))

        self.assertEqual(self.hook.bodies(), [{"title": "iAs 通知", "text": notice, "kind": "notice"}])
        self.assertEqual(self.wecom.bodies(), [{"msgtype": "text", "text": {"content": f"iAs 通知\n{notice}"}}])
        self.assertIn(notice, self._mail_text(self.smtp.messages[0]["data"]))
        everything = [json.dumps(b, ensure_ascii=False) for b in self.hook.bodies() + self.wecom.bodies()]
        everything += [self._mail_text(m["data"]) for m in self.smtp.messages]
        for body in everything:
            self.assertNotIn(code, body)
        self.assertEqual(self.sql("SELECT count(*) FROM outbox WHERE text LIKE %s", (f"%{code}%",)), [(0,)])

    @staticmethod
    def _mail_text(data: bytes) -> str:
        import email
        import email.policy
        return email.message_from_bytes(data, policy=email.policy.default).get_content()

    async def test_a_code_never_delivered_ends_as_delivery_failed(self):
        self.approval_timeout = 0.5
        self.restart(Fallback([]))
        await self.start()
        self.clock.at = DAY1 + timedelta(days=2)                    # never wrote: no window
        outcome = await self.call_high(self.ilink.owner, notify=self._notify)
        self.assertEqual(outcome["error"], "用户没有确认操作：mark_high")
        [decision] = self.sql("SELECT detail FROM audit_log WHERE event = 'approval_expired'")
        self.assertEqual(decision, ("delivery_failed",))
        self.assertEqual(self.ilink.sent, [])

    async def _notify(self, message: str):
        return await self.outbox.urgent(self.ilink.owner, self.channel.name, message, "mark_high", 0.5)

    async def test_a_held_confirmation_ends_by_the_monotonic_clock_not_the_wall_clock(self):
        await self.start()
        await self.owner_writes("/help")
        self.clock.at = DAY1 + timedelta(days=2)                    # the window shut long ago
        self.outbox.monotonic = self.clock.monotonic                # moved by the test alone
        held = await self.outbox.urgent(self.ilink.owner, self.channel.name, "确认码：123456", "mark_high", 60)
        self.assertIsInstance(held, asyncio.Event)
        self.clock.at += timedelta(hours=2)                         # the wall clock jumps (a Pi's NTP sync)
        await self.outbox.tick()
        await self.owner_writes("在吗")                            # still held: that is what goes out
        self.assertTrue(held.is_set())
        self.assertEqual(texts(self.ilink)[-1], "确认码：123456")
        held = await self.outbox.urgent(self.ilink.owner, self.channel.name, "确认码：654321", "mark_high", 60)
        self.assertTrue(held is True)                               # the window is open now
        self.clock.at += timedelta(days=2)
        second = await self.outbox.urgent(self.ilink.owner, self.channel.name, "确认码：111111", "mark_high", 60)
        self.assertIsInstance(second, asyncio.Event)
        self.clock.seconds += 61                                    # its time is over on the monotonic clock
        await self.outbox.tick()
        await self.owner_writes("/help")
        self.assertNotIn("确认码：111111", texts(self.ilink))
        self.assertFalse(second.is_set())


class FallbackTest(OutboxTestCase):
    async def test_a_failing_webhook_is_retried_then_recorded_and_the_reminder_stays_queued(self):
        self.hook.status = 500
        await self.start()
        sent = await self.outbox.send(self.ilink.owner, "吃药", kind="reminder", due=self.clock.at)
        self.assertEqual(sent, "queued")                            # no window: the owner never wrote
        self.clock.at += timedelta(minutes=10)
        with self.assertLogs("ias.notifiers", "WARNING"):
            await self.outbox.tick()
        self.assertEqual(len(self.hook.requests), 3)                # NOTIFY_ATTEMPTS
        [row] = await self.store.queued()
        self.assertEqual((row.state, row.attempts), ("queued", 1))
        self.assertTrue(row.reason.startswith("fallback failed: webhook: HTTP Error 500"), row.reason)
        self.hook.status = 200
        await self.outbox.tick()                                    # still inside the retry delay
        self.assertEqual(len(self.hook.requests), 3)
        self.clock.at += timedelta(minutes=5)
        await self.outbox.tick()
        self.assertEqual(self.fallback_texts()[-1], "吃药")
        self.assertEqual(await self.store.queued(), [])

    async def test_a_webhook_body_template_gets_the_notice_as_data(self):
        template = {"topic": "ias", "title": "[{kind}] {title}", "message": "{text}", "tags": ["{kind}"], "n": 1}
        hook = Webhook(self.hook.url, "t0k", template)
        await asyncio.to_thread(hook.deliver, Notice("提醒", '吃药 "{title}" \\ {kind}', "reminder"))
        _, _, headers, body = self.hook.requests[-1]
        self.assertEqual(body, {"topic": "ias", "title": "[reminder] 提醒", "message": '吃药 "{title}" \\ {kind}',
                                "tags": ["reminder"], "n": 1})       # placeholders in the text stay text
        self.assertEqual(headers["authorization"], "Bearer t0k")

    async def test_queued_messages_expire_and_the_owner_is_told_how_many(self):
        await self.start()
        for word in ("一", "二"):
            await self.outbox.send(self.ilink.owner, word)          # replies: never to the fallback
        self.clock.at += timedelta(days=3, seconds=1)
        await self.outbox.tick()
        self.assertEqual(self.sql("SELECT state, count(*) FROM outbox GROUP BY state"), [("expired", 2)])
        await self.owner_writes("/help", answers=2)
        self.assertIn("有 2 条消息等待超过 3 天仍未能送达，已过期。", texts(self.ilink))
        self.assertEqual(self.hook.requests, [])

    async def test_ret_minus_2_inside_the_window_shrinks_it_once(self):
        logs = capture_logs(self)
        await self.start()
        await self.owner_writes("/help")
        self.clock.at += timedelta(hours=20)
        self.ilink.send_replies = [{"ret": -2, "errmsg": "out of window"}, {"ret": -2, "errmsg": "out of window"}]
        self.assertEqual(await self.outbox.send(self.ilink.owner, "一"), "queued")
        self.assertEqual(await self.channel.room(self.ilink.owner), (0, "window"))
        shrunk = [r for r in logs if "the window for them is now" in r.getMessage()]
        self.assertEqual(len(shrunk), 1)
        self.assertEqual(self.sql("SELECT reason FROM outbox WHERE state = 'queued'"), [("window",)])
        await self.owner_writes("/help", answers=1)                 # a new window: the queued part goes first
        self.assertIn("一", texts(self.ilink))


class BudgetTest(OutboxTestCase):
    async def spend(self, count: int):
        for i in range(count):
            self.assertEqual(await self.outbox.send(self.ilink.owner, f"消息{i}"), "delivered")

    async def test_a_two_part_reply_with_one_message_left_waits_whole_for_the_owner(self):
        await self.start()
        await self.owner_writes("/help")
        await self.spend(6)                                         # 7 of 8 spent
        long = "甲" * 4000 + "\n" + "乙" * 10
        self.assertEqual(await self.outbox.send(self.ilink.owner, long), "queued")
        self.assertEqual(texts(self.ilink)[-1], BUDGET_NOTE)
        self.assertEqual([r.reason for r in await self.store.queued()], ["budget", "budget"])
        await self.owner_writes("继续", answers=2)
        await self.owner_writes("/help")
        self.assertEqual(texts(self.ilink)[-3:-1], ["甲" * 4000, "乙" * 10])      # 继续 only continued: no answer

    async def test_the_window_keeper_spends_the_last_message_once_when_a_task_is_due(self):
        await self.start()
        await self.owner_writes("/help")
        await self.outbox.tick()
        await add_task(self.store, self.ilink.owner, "开会", "2026-03-02 09:30", "reminder", "该开会了", now=DAY1)
        await self.outbox.tick()
        self.assertEqual([t for t in texts(self.ilink) if KEEPER in t], [])         # plenty of room, window open
        await self.spend(6)
        await self.outbox.tick()
        await self.outbox.tick()
        self.assertEqual([t for t in texts(self.ilink) if KEEPER in t], [f"今天 09:30 有提醒「开会」：{KEEPER}"])
        self.assertEqual(self.outbox.keeper_asks, 1)


class ConsoleTest(OutboxTestCase):
    async def test_without_a_terminal_or_wechat_reminders_go_to_the_fallback_and_everything_is_recorded(self):
        out = io.StringIO()
        console = ConsoleChannel("owner", stdin=io.StringIO(""), stdout=out, interactive=False)
        outbox = Outbox(self.store, {"console": console}, "console", self.fallback, now=self.clock.now)
        task = await add_task(self.store, "owner", "喝水", "0 7 * * *", "reminder", "该喝水了", now=DAY1)
        run_id = self.sql("INSERT INTO task_runs (task_id, slot) VALUES (%s, %s) RETURNING id", (task.id, DAY1))[0][0]
        await outbox.send("owner", "该喝水了", kind="reminder", run_id=run_id)
        self.assertEqual(await outbox.send("owner", "一条回答"), "delivered")
        self.assertEqual(self.fallback_texts(), ["该喝水了"])
        self.assertEqual(out.getvalue(), "该喝水了\n一条回答\n")          # the log still shows both
        self.assertEqual(self.sql("SELECT kind, state FROM outbox ORDER BY id"),
                         [("reminder", "fallback"), ("reply", "sent")])
        self.assertEqual(self.task_runs(task.id)[0].delivery, "fallback")


class ConcurrentUsersTest(OutboxTestCase):
    async def test_replies_to_several_users_sent_at_once_are_each_settled_once(self):
        # Two users' flushes settled the same part at once, and the second failed with a KeyError.
        channel = FakeChannel("fake")
        outbox = Outbox(self.store, {"fake": channel}, "fake", now=self.clock.now)
        outcomes = await asyncio.gather(*(outbox.send(f"user{i}", f"回答{i}") for i in range(6)))
        self.assertEqual(outcomes, ["delivered"] * 6)
        self.assertEqual(sorted(text for _, text in channel.sent), [f"回答{i}" for i in range(6)])
        self.assertEqual(await self.store.queued(), [])


class RestartTest(OutboxTestCase):
    async def test_what_waits_for_wechat_survives_a_restart_and_console_leftovers_are_dropped(self):
        console = FakeChannel("console", deliver=False)
        outbox = Outbox(self.store, {"wechat": self.channel, "console": console}, "wechat", now=self.clock.now)
        self.assertEqual(await outbox.send(self.ilink.owner, "给微信"), "queued")           # no window yet
        self.assertEqual(await outbox.send("owner", "给终端", "console"), "queued")          # printing failed
        console.deliver = True
        after = Outbox(self.store, {"wechat": self.channel, "console": console}, "wechat", now=self.clock.now)
        self.assertEqual(await after.forget_unresumable(), 1)
        self.assertEqual([row.text for row in await self.store.queued()], ["给微信"])
        self.assertEqual(self.sql("SELECT state, reason, noticed FROM outbox WHERE channel = 'console'"),
                         [("expired", "restart", True)])
        await after.tick()
        self.assertEqual(console.sent, [("owner", "给终端")])         # only the first, failed attempt


class RateLimitTest(OutboxTestCase):
    async def test_ret_minus_2_soon_after_the_owners_message_is_retried_not_learned(self):
        await self.start()
        await self.owner_writes("/help")
        self.clock.at += timedelta(hours=1)
        self.ilink.send_replies = [{"ret": -2, "errmsg": "rate limited"}]
        self.assertEqual(await self.outbox.send(self.ilink.owner, "一"), "queued")
        [row] = await self.store.queued()
        self.assertEqual((row.reason, row.attempts), ("send failed", 1))
        self.assertEqual(await self.channel.room(self.ilink.owner), (7, None))
        self.clock.at += timedelta(minutes=1)
        await self.outbox.tick()
        self.assertEqual(texts(self.ilink)[-2:], ["一", "一"])          # the retry, under the same client_id
        self.assertEqual(self.ilink.sent[-1]["client_id"], self.ilink.sent[-2]["client_id"])


@slow
class CommandTest(OutboxTestCase):
    async def test_outbox_and_tasks_list_show_what_waits_and_how_tasks_were_delivered(self):
        task = await add_task(self.store, "owner", "喝水", "0 7 * * *", "reminder", "该喝水了", now=DAY1)
        scheduler = Scheduler(self.store, self.router.run_task, now=lambda: DAY1 + timedelta(hours=2))
        await asyncio.gather(*await scheduler.tick())
        env = {"IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp), "PATH": "/usr/bin:/bin"}

        def ias(*args):
            return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                                  env=env, timeout=60)
        listed = await asyncio.to_thread(ias, "outbox")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertRegex(listed.stdout, r"queued\s+reminder\s+wechat\s+attempts=0\s+reason=window .*该喝水了")
        tasks = await asyncio.to_thread(ias, "tasks", "list")
        self.assertIn("last queued", tasks.stdout)
        self.assertEqual(json.loads((await asyncio.to_thread(ias, "tasks", "list", "--json")).stdout)[0]["last_delivery"],
                         "queued")
        self.assertEqual(self.task_runs(task.id)[0].delivery, "queued")
        everything = await asyncio.to_thread(ias, "outbox", "--all")
        self.assertIn("该喝水了", everything.stdout)


class SendAndMarkTest(OutboxTestCase):
    """A send and its "sent" mark are not split; a send that got no answer is not repeated soon."""

    async def test_a_send_that_answers_after_the_client_timeout_is_not_sent_again_while_it_may_land(self):
        await self.start()
        await self.owner_writes("/help")
        self.channel.send_timeout = 0.3
        self.ilink.send_replies = [{"ret": 0, "hold": 1.0}]        # lands at once, answers after 1 s
        self.assertEqual(await self.outbox.send(self.ilink.owner, "慢的回答"), "queued")
        [row] = await self.store.queued()
        self.assertEqual((row.reason, row.attempts), (IN_DOUBT, 1))
        self.assertEqual(await self.outbox.send(self.ilink.owner, "下一条"), "delivered")   # what follows goes on
        for minutes in (1, 2, 5, 9):
            self.clock.at = DAY1 + timedelta(minutes=minutes)
            await self.outbox.tick()
        self.assertEqual(texts(self.ilink).count("慢的回答"), 1)
        self.clock.at = DAY1 + timedelta(seconds=limits.OUTBOX_UNKNOWN_WAIT + 60)
        await self.outbox.tick()                                    # then once more, under the same client_id
        again = [m["client_id"] for m in self.ilink.sent if m["item_list"][0]["text_item"]["text"] == "慢的回答"]
        self.assertEqual(len(again), 2)
        self.assertEqual(again[0], again[1])
        self.assertEqual(await self.store.queued(), [])

    async def test_a_cancelled_send_is_finished_and_marked_before_the_cancel_completes(self):
        await self.start()
        await self.owner_writes("/help")
        self.ilink.send_replies = [{"ret": 0, "hold": 0.5}]
        sending = asyncio.create_task(self.outbox.send(self.ilink.owner, "停机时的回答"))
        await until(lambda: "停机时的回答" in texts(self.ilink))
        sending.cancel()                                            # shutdown cancels the turn mid-send
        with self.assertRaises(asyncio.CancelledError):
            await sending
        self.assertEqual(self.sql("SELECT state FROM outbox WHERE text = %s", ("停机时的回答",)), [("sent",)])

    async def test_a_stop_past_the_grace_leaves_the_part_in_doubt_not_sent_again_at_the_next_start(self):
        await self.start()
        await self.owner_writes("/help")
        self.ilink.send_replies = [{"ret": 0, "hold": 1.0}]
        with mock.patch.object(limits, "OUTBOX_SEND_GRACE", 0.1):
            sending = asyncio.create_task(self.outbox.send(self.ilink.owner, "停机时的回答"))
            await until(lambda: "停机时的回答" in texts(self.ilink))
            sending.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await sending
        await self.channel.stop()
        self.restart()                                              # the next start
        self.clock.at += timedelta(minutes=1)
        await self.outbox.tick()
        self.assertEqual(texts(self.ilink).count("停机时的回答"), 1)


class RepliesFirstTest(OutboxTestCase):
    async def test_twenty_queued_reminders_wait_behind_the_answer_and_are_summarised_in_one_line(self):
        await self.start()
        for i in range(20):                                         # the window is shut: they queue
            self.assertEqual(await self.outbox.send(self.ilink.owner, f"提醒{i}", kind="reminder", due=self.clock.at),
                             "queued")
        await self.owner_writes("/help", answers=2)
        first, summary = texts(self.ilink)
        self.assertIn("/reset", first)                              # the answer to their question comes first
        self.assertEqual(summary, BACKLOG_NOTE.format(count=20))
        self.assertEqual(summary, "还有 20 条消息待发送，回复「继续」查看")
        await self.owner_writes("继续", answers=8)
        self.assertEqual(texts(self.ilink)[2:], [f"提醒{i}" for i in range(7)] + [BACKLOG_NOTE.format(count=13)])
        await self.owner_writes("/help", answers=2)                 # a new question: its answer first again
        self.assertIn("/reset", texts(self.ilink)[-2])
        self.assertEqual(texts(self.ilink)[-1], BACKLOG_NOTE.format(count=13))

    async def test_a_backlog_that_fits_follows_the_answer_and_nothing_goes_while_the_answer_is_awaited(self):
        await self.start()
        await self.owner_writes("/help")
        self.clock.at += timedelta(days=1)                          # the window shut
        for i in range(3):
            await self.outbox.send(self.ilink.owner, f"提醒{i}", kind="reminder", due=self.clock.at)
        before = len(self.ilink.sent)
        for question in ("今天天气怎么样", "明天呢"):                 # two questions in a row
            self.assertFalse(await self.outbox.inbound(self.ilink.owner, self.channel.name, question))
        self.channel._peers[self.ilink.owner].last_inbound = self.clock.timestamp()     # what the channel records
        await self.outbox.tick()                                    # the turns still run: nothing goes
        self.assertEqual(len(self.ilink.sent), before)
        self.assertEqual(await self.outbox.send(self.ilink.owner, "晴，25 度。"), "delivered")
        self.assertEqual(texts(self.ilink)[before:], ["晴，25 度。"])             # the second answer is still due
        self.assertEqual(await self.outbox.send(self.ilink.owner, "多云。"), "delivered")
        self.assertEqual(texts(self.ilink)[before:], ["晴，25 度。", "多云。", "提醒0", "提醒1", "提醒2"])

    async def test_what_waits_is_held_for_an_answer_that_never_comes_only_so_long(self):
        await self.start()
        self.outbox.monotonic = self.clock.monotonic
        await self.outbox.send(self.ilink.owner, "提醒", kind="reminder", due=self.clock.at)
        self.assertFalse(await self.outbox.inbound(self.ilink.owner, self.channel.name, "你好"))
        self.channel._peers[self.ilink.owner].last_inbound = self.clock.timestamp()
        await self.outbox.tick()
        self.assertEqual(self.ilink.sent, [])                       # its turn failed without a queued answer
        self.clock.seconds += limits.OUTBOX_ANSWER_HOLD
        await self.outbox.tick()
        self.assertEqual(texts(self.ilink), ["提醒"])

    async def test_a_400000_character_reply_is_at_most_20_parts_and_does_not_hold_up_the_next_answer(self):
        await self.start()
        await self.owner_writes("/help")
        self.assertEqual(await self.outbox.send(self.ilink.owner, "长" * 400_000), "queued")
        rows = self.sql("SELECT text FROM outbox WHERE text LIKE '长%%' OR text LIKE '（%%' ORDER BY id")
        self.assertEqual(len(rows), limits.OUTBOX_PARTS_MAX)
        self.assertEqual(rows[-1], ("（内容过长，其余 324000 字未发送）",))
        self.assertEqual({len(text) for (text,) in rows[:-1]}, {4000})
        self.assertEqual(texts(self.ilink)[1:], ["长" * 4000] * 6 + [BUDGET_NOTE])     # 7 of 8 left after /help
        await self.owner_writes("/skills", answers=2)               # its answer goes before the 14 parts left
        self.assertIn("mark_high", texts(self.ilink)[-2])
        self.assertEqual(texts(self.ilink)[-1], BACKLOG_NOTE.format(count=14))


class TaskLaneTest(OutboxTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.llm_server = LLMServer([stall()]).__enter__()         # the first task's turn never ends
        self.llm = LLM("sk-test", self.llm_server.base_url, "test-model", retry_delays=(0.01,))
        self.restart()

    async def asyncTearDown(self):
        await self.scheduler.stop()
        await super().asyncTearDown()
        await self.llm.close()
        await asyncio.to_thread(self.llm_server.__exit__)

    async def test_a_hundred_due_prompt_tasks_do_not_make_the_owners_message_wait(self):
        for i in range(100):
            await add_task(self.store, self.ilink.owner, f"任务{i}", "0 6 * * *", "prompt", f"问题{i}", now=DAY1)
        self.scheduler = Scheduler(self.store, self.router.run_task, now=self.clock.now)
        await self.start()
        self.clock.at = DAY1 + timedelta(hours=1)
        self.assertEqual(len(await self.scheduler.tick()), 100)
        await until(lambda: self.llm_server.requests)               # a task's turn is running (and stays)
        await self.owner_writes("/help")
        self.assertIn("/reset", texts(self.ilink)[-1])
        self.assertEqual(len(self.llm_server.requests), 1)          # the tasks still wait in their own lane

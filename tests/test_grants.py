"""Grants (SPEC §12) against a real database: `CODE+N次`, `+1h`, `+1d` let later equal High calls run without a
code — and nothing a database writer does to the rows widens one, nor does another user's grant apply."""
import asyncio
import unittest
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from ias.approval import TurnBudget, parse_reply
from ias.clock import TZ
from ias.grants import SUFFIX_HELP, term
from ias.sandbox import Policy
from ias.scheduler import Scheduler, add_task
from tests.support import CODE_LINE, FakeChannel, FakeClock, FakeOwner, GateTestCase, ScriptedLLM, answer, ask, until

REFUSED = {"success": False, "error": "用户拒绝了你的调用：mark_high"}


class SuffixTest(unittest.TestCase):
    def test_the_accepted_forms_and_nothing_else(self):
        self.assertEqual((term("+1h").seconds, term("+1d").seconds, term("+3次").uses), (3600, 86400, 3))
        self.assertEqual(term("+20次").uses, 20)
        for bad in ("+99次", "+21次", "+0次", "+2w", "+2h", "+1", "+", "+1h ", "+次", "+1d1h", "-1h"):
            self.assertIsNone(term(bad), bad)
        for reply in ("123456+3次", "１２３４５６＋３次", " 123456+1h ", "123456+99次", "123456+2w"):
            self.assertEqual(parse_reply(reply), "code", reply)      # code-shaped: never reaches the model
        self.assertIsNone(parse_reply("1234567+1h"))


class GrantTestCase(GateTestCase):
    def call(self, user: str = "owner", owner: FakeOwner | None = None, name: str = "mark_high", turn=None, **params):
        """Start a High call in the background (mark_high unless `name`); its task."""
        params.setdefault("marker", str(self.marker))
        return asyncio.create_task(self.gate.call(user, name, params, (owner or self.owner).notify, turn))

    async def approve(self, suffix: str, user: str = "owner", owner: FakeOwner | None = None, turn=None,
                      **params) -> str:
        """A call asked and approved with `CODE` + `suffix`; the answer to the owner (the call has run)."""
        owner = owner or self.owner
        call = self.call(user, owner, turn=turn, **params)
        said = await self.approvals.redeem(user, await owner.code() + suffix)
        result = await asyncio.wait_for(call, 10)
        self.assertTrue(result["success"], result)
        return said

    async def runs_granted(self, turn=None, **params) -> None:
        asked = len(self.owner.messages)
        result = await asyncio.wait_for(self.call(turn=turn, **params), 10)
        self.assertTrue(result["success"], result)
        self.assertEqual(len(self.owner.messages), asked, "the owner was asked")

    async def asks(self, user: str = "owner", owner: FakeOwner | None = None, turn=None, **params) -> None:
        """The call asks for a code (cancelled here, so it does not run)."""
        owner = owner or self.owner
        before = self.runs()
        call = self.call(user, owner, turn=turn, **params)
        await owner.code()
        self.assertEqual(await self.approvals.redeem(user, "0"), "已取消：mark_high")
        self.assertEqual(await asyncio.wait_for(call, 10), REFUSED)
        self.assertEqual(self.runs(), before)

    def audit(self, *events: str) -> list[tuple]:
        return self.sql("SELECT event, decision, detail FROM audit_log WHERE event = ANY(%s) ORDER BY id",
                        (list(events),))

    async def slash(self, text: str) -> str:
        return await self.agent.turn("owner", text, None)


class CountGrantTest(GrantTestCase):
    async def test_three_uses_the_approving_call_and_two_more(self):
        said = await self.approve("+3次")
        self.assertEqual(said, "已确认，正在执行：mark_high（已授权相同参数共 3 次免确认（含本次），30 天内有效）")
        await self.runs_granted()
        await self.runs_granted()
        self.assertEqual(self.runs(), 3)
        await self.asks()
        [(grant_id,)] = self.sql("SELECT id FROM grants")
        self.assertEqual(self.audit("grant_created", "grant_used"), [
            ("grant_created", "created", f"grant={grant_id} uses=1/3"),
            ("grant_used", "granted", f"grant={grant_id} uses=2/3"),
            ("grant_used", "granted", f"grant={grant_id} uses=3/3")])
        started = self.sql("SELECT decision, approval_id, detail FROM audit_log WHERE event = 'skill_started' "
                           "ORDER BY id")
        self.assertEqual([(d, a is None) for d, a, _ in started], [("approved", False), ("granted", True),
                                                                    ("granted", True)])
        self.assertTrue(started[1][2].endswith(f" grant={grant_id}"))
        finished = self.sql("SELECT decision, detail FROM audit_log WHERE event = 'skill_finished' ORDER BY id")
        self.assertEqual([row[1] for row in finished[1:]], [row[2] for row in started[1:]])
        self.assertEqual([row[0] for row in finished], ["approved", "granted", "granted"])

    async def test_a_grant_outlives_a_restart_and_another_key_does_not_honour_it(self):
        await self.approve("+3次")
        self.use(self.build())                      # the next daemon: same key, nothing in memory
        await self.runs_granted()
        self.key = bytes(32)                        # a database moved under another secret key
        self.use(self.build())
        await self.asks()                           # its lookup digest is another: not even a candidate
        self.assertEqual(len(self.audit("grant_used")), 1)

    async def test_other_parameters_and_another_user_ask(self):
        await self.approve("+5次")
        await self.asks(note="other")               # a parameter differs
        await self.asks(user="guest", owner=FakeOwner())
        await self.runs_granted(note="none")        # the default, given: equal after defaults
        self.assertEqual(self.audit("grant_tampered"), [])

    async def test_a_task_grant_serves_that_task_only_and_a_chat_grant_serves_tasks_too(self):
        first = await add_task(self.store, "owner", "甲", "0 7 * * *", "prompt", "x")
        second = await add_task(self.store, "owner", "乙", "0 8 * * *", "prompt", "y")
        said = await self.approve("+1h", turn=TurnBudget(first.id))
        self.assertEqual(said, "已确认，正在执行：mark_high（已授权本定时任务 1 小时内相同参数免确认）")
        await self.asks()                                       # a chat call
        await self.asks(turn=TurnBudget(second.id))             # another task
        await self.runs_granted(turn=TurnBudget(first.id))
        self.assertRegex(await self.slash("/grants"), r"，仅定时任务「甲」\n")
        await self.approve("+3次", note="chat")
        await self.runs_granted(turn=TurnBudget(second.id), note="chat")

    async def test_revoke_all_and_one_end_grants(self):
        await self.approve("+3次")
        await self.approve("+1h", note="b")
        self.assertIn("有效授权：2 个", await self.slash("/status"))
        listing = await self.slash("/grants")
        self.assertRegex(listing, r"#\d+ mark_high：已用 1/3 次，至 \d{4}-\d\d-\d\d \d\d:\d\d CST\n  参数：\{")
        self.assertIn('"note":"b"', listing)
        [first, second] = [row[0] for row in self.sql("SELECT id FROM grants ORDER BY id")]
        self.assertEqual(await self.slash(f"/revoke {second}"), f"已撤销授权 #{second}。")
        await self.asks(note="b")
        self.assertEqual(await self.slash("/revoke 99"), "没有编号为 99 的有效授权（/grants 查看）。")
        self.assertEqual(await self.slash("/revoke x"), "用法：/revoke 编号 或 /revoke all（编号见 /grants）")
        self.assertEqual(await self.slash("/revoke all"), "已撤销全部授权（1 个）。")
        await self.asks()
        self.assertEqual(await self.slash("/grants"), "没有有效的授权。")
        self.assertEqual([r[2] for r in self.audit("grant_revoked")], [f"grant={second}", f"grant={first}"])

    async def test_revoke_of_another_users_grant_is_refused(self):
        guest = FakeOwner()
        await self.approve("+3次", user="guest", owner=guest)
        [(grant_id,)] = self.sql("SELECT id FROM grants")
        self.assertEqual(await self.slash(f"/revoke {grant_id}"), f"没有编号为 {grant_id} 的有效授权（/grants 查看）。")
        self.assertEqual(await self.slash("/grants"), "没有有效的授权。")
        self.assertEqual(self.sql("SELECT revoked_at FROM grants"), [(None,)])

    async def test_a_malformed_suffix_costs_no_attempt_and_a_wrong_code_with_a_suffix_does(self):
        call = self.call()
        code = await self.owner.code()
        for reply in (code + "+99次", code + "+2w", code + "+"):
            self.assertEqual(await self.approvals.redeem("owner", reply), SUFFIX_HELP)
        self.assertEqual(self.sql("SELECT attempts_left FROM pending_approvals"), [(3,)])
        wrong = f"{(int(code) + 1) % 10 ** 6:06d}"
        self.assertEqual(await self.approvals.redeem("owner", wrong + "+3次"), "确认码错误，还剩 2 次")
        said = await self.approvals.redeem("owner", "".join(chr(0xFF10 + int(d)) for d in code) + "＋２次")
        self.assertTrue(said.startswith("已确认，正在执行：mark_high（已授权相同参数共 2 次"), said)
        self.assertTrue((await call)["success"])
        await self.runs_granted()
        await self.asks()

    async def test_a_bare_code_grants_nothing(self):
        self.assertEqual(await self.approve(""), "已确认，正在执行：mark_high")
        self.assertEqual(self.sql("SELECT count(*) FROM grants"), [(0,)])
        await self.asks()

    async def test_two_calls_racing_for_the_last_use_run_it_once(self):
        await self.approve("+2次")
        calls = [self.call(), self.call()]
        await self.owner.code()                     # the loser asks
        self.assertEqual(await self.approvals.redeem("owner", "0"), "已取消：mark_high")
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        self.assertEqual(sorted(r["success"] for r in results), [False, True])
        self.assertEqual(self.runs(), 2)
        self.assertEqual(len(self.audit("grant_used")), 1)
        self.assertEqual(self.sql("SELECT uses, uses_max FROM grants"), [(2, 2)])


class TamperTest(GrantTestCase):
    """A writer of the database edits or forges grant rows: refused (`tampered`), the call asks for a code."""

    async def test_widened_rows_are_refused(self):
        task = await add_task(self.store, "owner", "t", "0 7 * * *", "prompt", "x")
        edits = {
            "uses_max": ("UPDATE grants SET uses_max = 20",),
            "expires_at": ("UPDATE grants SET expires_at = expires_at + interval '1 day'",),
            "expires_at within a second": ("UPDATE grants SET expires_at = expires_at + interval '1 millisecond'",),
            "params": ("UPDATE grants SET params = jsonb_set(params, '{note}', '\"evil\"')",),
            "skill": ("UPDATE grants SET skill_name = 'echo_low'",),
            "user": ("UPDATE grants SET user_id = 'guest'",),
            "task": ("UPDATE grants SET task_id = %s", task.id),
            "approval": ("UPDATE grants SET approval_id = gen_random_uuid()",),
        }
        for what, (sql, *args) in edits.items():
            with self.subTest(what):
                self.sql("DELETE FROM grants")
                self.sql("DELETE FROM pending_approvals")
                before = len(self.audit("grant_tampered"))
                await self.approve("+3次")
                self.sql(sql, tuple(args))
                await self.asks(**({"note": "evil"} if what == "params" else {}))     # the call the edit is for
                tampered = self.audit("grant_tampered")[before:]
                if what == "task":          # bound to a task now: not even a candidate of a chat call
                    self.assertEqual(tampered, [])
                    continue
                self.assertEqual([row[1] for row in tampered], ["tampered"], what)

    async def test_uses_turned_back_and_a_revoke_undone_are_refused(self):
        await self.approve("+3次")
        await self.runs_granted()
        self.sql("UPDATE grants SET uses = 1")
        await self.asks()
        [(_, _, detail)] = self.audit("grant_tampered")
        self.assertRegex(detail, r"grant=\d+: uses went down from 2 to 1")
        self.sql("DELETE FROM grants")
        await self.approve("+1h", note="b")
        self.assertEqual(await self.slash("/revoke all"), "已撤销全部授权（1 个）。")
        self.sql("UPDATE grants SET revoked_at = NULL")
        await self.asks(note="b")
        self.assertRegex(self.audit("grant_tampered")[-1][2], r"grant=\d+: revoked by this daemon")

    async def test_forged_rows_are_refused(self):
        await self.approve("+2次")
        await self.runs_granted()                   # used up
        # A copy of the genuine row under a new id (its lookup digest and MAC copied), with uses to spare.
        self.sql("INSERT INTO grants (user_id, skill_name, params, task_id, uses_max, uses, expires_at, approval_id, "
                 "lookup, mac) SELECT user_id, skill_name, params, task_id, 20, 0, expires_at, approval_id, lookup, "
                 "mac FROM grants")
        await self.asks()                           # its lookup digest is another: not even a candidate
        self.assertEqual(len(self.audit("grant_used")), 1)
        # One made up from scratch is not even found.
        self.sql("INSERT INTO grants (user_id, skill_name, params, uses_max, expires_at, approval_id, lookup, mac) "
                 "VALUES ('owner', 'mark_high', %s, 20, now() + interval '1 day', gen_random_uuid(), 'x', 'v1:y')",
                 (f'{{"marker": "{self.marker}", "note": "none"}}',))
        await self.asks()
        self.assertEqual(self.runs(), 2)


class CappedTest(GrantTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.clock = FakeClock(datetime(2026, 3, 2, 1, 0, 0, 250000, tzinfo=timezone.utc))
        self.use(self.build(now=self.clock.now))
        mark = self.registry.get("mark_high")
        self.registry.skills["execute_shell"] = replace(mark, name="execute_shell")
        self.registry.skills["open_high"] = replace(mark, name="open_high", sandbox=Policy(unconfined=True))

    async def approve_named(self, name: str, suffix: str) -> str:
        call = self.call(name=name)
        said = await self.approvals.redeem("owner", await self.owner.code() + suffix)
        self.assertTrue((await asyncio.wait_for(call, 10))["success"])
        return said

    async def test_execute_shell_is_granted_one_hour_at_most(self):
        said = await self.approve_named("execute_shell", "+1d")
        self.assertEqual(said, "已确认，正在执行：execute_shell（已授权 1 小时内相同参数免确认；此技能最长授权 1 小时）")
        [(expires,)] = self.sql("SELECT expires_at FROM grants")
        self.assertEqual(expires, datetime(2026, 3, 2, 2, 0, 0, tzinfo=timezone.utc))
        self.clock.advance(59 * 60)
        asked = len(self.owner.messages)
        self.assertTrue((await asyncio.wait_for(self.call(name="execute_shell"), 10))["success"])
        self.assertEqual(len(self.owner.messages), asked)
        self.clock.advance(60)                      # 60 minutes after the approval
        call = self.call(name="execute_shell")
        await self.owner.code()
        await self.approvals.redeem("owner", "0")
        self.assertFalse((await call)["success"])

    async def test_unconfined_count_grants_last_an_hour_and_one_hour_is_not_cut(self):
        said = await self.approve_named("open_high", "+5次")
        self.assertEqual(said, "已确认，正在执行：open_high（已授权相同参数共 5 次免确认（含本次），1 小时内有效；"
                               "此技能最长授权 1 小时）")
        self.sql("DELETE FROM grants")
        said = await self.approve_named("open_high", "+1h")
        self.assertEqual(said, "已确认，正在执行：open_high（已授权 1 小时内相同参数免确认）")
        said = await self.approve_named("mark_high", "+1d")
        self.assertEqual(said, "已确认，正在执行：mark_high（已授权 1 天内相同参数免确认）")


DAY1 = datetime(2026, 3, 2, 5, 0, tzinfo=TZ)


class DailyTaskTest(GrantTestCase):
    """A daily 07:00 prompt task whose model sends "mail" (a High call, fixed params) every morning."""

    async def test_three_days_on_one_approval_and_the_fourth_asks(self):
        clock = FakeClock(DAY1)
        channel = FakeChannel("wechat")
        call = ("mark_high", {"marker": str(self.marker), "note": "weather"})
        model = ScriptedLLM(ask(call), answer("已发送。"), ask(call), answer("已发送。"), ask(call), answer("已发送。"),
                            ask(call), answer("没有确认。"))
        self.use(self.build(llm=model, channels=[channel], primary=channel, now=clock.now))
        task = await add_task(self.store, "owner", "天气邮件", "0 7 * * *", "prompt", "把天气发邮件给我", now=DAY1)
        scheduler = Scheduler(self.store, self.router.run_task, now=clock.now)

        def confirmations() -> list[str]:
            return [text for _, text in channel.sent if "确认码：" in text]
        for day in range(4):
            clock.at = DAY1 + timedelta(days=day, hours=2)             # 07:00 Beijing time
            runs = await scheduler.tick()
            self.assertEqual(len(runs), 1)
            if day in (0, 3):       # the first morning asks (approved with +3次), and the fourth again
                asked = 1 if day == 0 else 2
                await until(lambda: len(confirmations()) >= asked)
                code = CODE_LINE.search(confirmations()[-1]).group(1)
                said = await self.approvals.redeem("owner", code + "+3次" if day == 0 else "0")
                if day == 0:
                    self.assertEqual(said, "已确认，正在执行：mark_high（已授权本定时任务相同参数共 3 次免确认（含本次），"
                                           "30 天内有效）")
            await asyncio.wait_for(asyncio.gather(*runs), 10)
            self.assertEqual(self.runs(), min(day + 1, 3))
            if day == 0:            # bound to the task: the same call from a chat asks
                await self.asks(note="weather")
        model.assert_complete()
        self.assertEqual(self.sql("SELECT task_id, uses, uses_max FROM grants"), [(task.id, 3, 3)])
        self.assertEqual(len(confirmations()), 2)
        self.assertEqual([r[1] for r in self.audit("grant_used")], ["granted", "granted"])

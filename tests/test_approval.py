"""The approval gate against real PostgreSQL: every outcome, races, and where the code may appear."""
import asyncio
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import unittest
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from ias import approval
from ias.approval import Approvals, TurnBudget, code_hash, load_key, parse_reply
from ias.confirmation import escape_visible, render
from ias.errors import ConfigError
from ias.store import AuditEntry
from tests import test_agent
from tests.support import CODE_LINE, REPO, FakeClock, FakeOwner, GateTestCase, StoreTestCase, answer, ask, capture_logs

def unescape(shown: str) -> str:
    """Read an escaped text back, as an owner would: the test's proof that the escaping is unambiguous."""
    out, i = [], 0
    while i < len(shown):
        if shown[i] == "\\" and i + 1 < len(shown):
            nxt = shown[i + 1]
            if nxt in "\\ntr":
                out.append({"\\": "\\", "n": "\n", "t": "\t", "r": "\r"}[nxt])
                i += 2
                continue
            if nxt == "u" and shown.startswith("{", i + 2):
                end = shown.index("}", i)
                out.append(chr(int(shown[i + 3:end], 16)))
                i = end + 1
                continue
        out.append(shown[i])
        i += 1
    return "".join(out)


REJECTED = {"success": False, "error": "用户拒绝了你的调用：mark_high"}
EXPIRED = {"success": False, "error": "用户没有确认操作：mark_high"}
TOO_LONG = {"success": False, "error": "参数过长，无法请求确认：mark_high"}
TOO_MANY = {"success": False, "error": "本轮待确认操作过多，未请求确认：mark_high"}


class ReplyGrammarTest(unittest.TestCase):
    def test_grammar(self):
        self.assertEqual(parse_reply(" 123456 "), "code")
        self.assertEqual(parse_reply("１２３４５６"), "code")           # full-width → NFKC ASCII
        self.assertIsNone(parse_reply("١٢٣٤٥٦"))                      # Arabic-Indic digits are not a code
        self.assertIsNone(parse_reply("۱۲۳۴۵۶"))                      # nor Extended Arabic-Indic
        self.assertIsNone(parse_reply("12345"))
        self.assertIsNone(parse_reply("1234567"))
        self.assertIsNone(parse_reply("12 3456"))
        self.assertEqual(parse_reply("0"), "cancel")
        self.assertEqual(parse_reply("０"), "cancel")
        self.assertEqual(parse_reply(" 取消\n"), "cancel")
        self.assertIsNone(parse_reply("好的"))

    def test_codes_are_six_digits_with_leading_zeros(self):
        codes = {approval.new_code() for _ in range(2000)}
        self.assertTrue(all(len(c) == 6 and c.isascii() and c.isdigit() for c in codes))
        self.assertTrue(any(c.startswith("0") for c in codes))

    def test_escape_visible(self):
        self.assertEqual(escape_visible("a\nb\tc\u202ed\u200be\x00"),
                         ("a\\nb\\tc\\u{202e}d\\u{200b}e\\u{0000}", True))
        self.assertEqual(escape_visible("rm -rf ~/照片"), ("rm -rf ~/照片", False))
        self.assertEqual(escape_visible("发送“周报”到《项目》群：好的，谢谢！……——〇·【急】￥5"),
                         ("发送“周报”到《项目》群：好的，谢谢！……——〇·【急】￥5", False))
        self.assertEqual(escape_visible("𠀀𪜀𫝀𫠠𬺰\U00030000\uf900\U0002f800"),       # ideographs of every extension
                         ("𠀀𪜀𫝀𫠠𬺰\U00030000\uf900\U0002f800", False))

    def test_look_alikes_are_escaped(self):
        """The allow-list: a Cyrillic а in a host name reads as an escape, and the line gets marked."""
        self.assertEqual(escape_visible("https://r\u0430w.githubusercontent.com/x"),
                         ("https://r\\u{0430}w.githubusercontent.com/x", True))
        for char in ("\u03bf", "\u0430", "\u0456", "\u13a0", "\u2013", "\u2212", "\uff41", "\uff11", "\u2f00",
                     "\u2e80", "\u3021", "\uff3c", "\uff61", "\u00e9", "\u0301", "\u302a", "\U0001d400",
                     "\U0001f600", "\u2024", "\u0378", "\U000e0080"):
            with self.subTest(char=hex(ord(char))):
                self.assertEqual(escape_visible(f"a{char}b"), (f"a\\u{{{ord(char):04x}}}b", True))

    def test_blank_looking_characters_are_escaped(self):
        for char in ("\u3000", "\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\u00a0", "\u2007", "\u202f",
                     "\u205f", "\u1680", "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u061c", "\u2028",
                     "\u2029", "\u202e", "\u2066", "\u180e", "\ufe0f", "\U000e0041", "\U000e0100", "\u034f",
                     "\u17b4", "\u303f", "\ue000", "\U000f0000", "\x85", "\x7f", "\udc80", "\U0001d159",
                     "\U00016fe4", "\U0001da7f", "\U0001d173", "\u2062", "\U000e0001", "\u3164", "\u1cbb"):
            with self.subTest(char=hex(ord(char))):
                shown, special = escape_visible(f"ls{char}x")
                self.assertNotIn(char, shown)
                self.assertRegex(shown, r"^ls\\u\{[0-9a-f]{4,6}\}x$")
                self.assertTrue(special)

    def test_spaces_show_as_they_are_only_inside_and_in_short_runs(self):
        self.assertEqual(escape_visible("a" + " " * 8 + "b"), ("a" + " " * 8 + "b", False))
        self.assertEqual(escape_visible("a" + " " * 9 + "b"), ("a" + "\\u{0020}" * 9 + "b", True))
        self.assertEqual(escape_visible(" /tmp/x "), ("\\u{0020}/tmp/x\\u{0020}", True))     # invisible at the ends
        self.assertEqual(escape_visible(""), ("", False))

    def test_backslashes_that_read_as_escapes_are_doubled(self):
        self.assertEqual(escape_visible("a\\nb"), ("a\\\\nb", False))           # a real backslash-n, not a newline
        self.assertEqual(escape_visible("\\u{202e}"), ("\\\\u{202e}", False))
        self.assertEqual(escape_visible("C:\\Program Files\\x"), ("C:\\Program Files\\x", False))
        self.assertEqual(escape_visible("a\\"), ("a\\", False))
        for one, other in (("a\\nb", "a\nb"), ("\\\n", "\\n"), ("\\\\n", "\\\n"), ("\\\u0430", "\\u{0430}")):
            self.assertNotEqual(escape_visible(one)[0], escape_visible(other)[0], (one, other))
        for text in ("a\\nb", "\\\n", "\\\\n", "\\\u0430", "x\\\\\\", "\\u{41}\\\\u{42}", "\\ \\  \\"):
            self.assertEqual(unescape(escape_visible(text)[0]), text)

    def test_render(self):
        schema = {"type": "object", "properties": {"to": {"title": "收件人"}, "n": {"type": "integer"}}}
        row = approval.Approval(uuid.uuid4(), None, None, "u", "email", {"x": "\u2066evil", "n": 2, "to": "a@b.c"},
                                "", 3, "pending", None, None)
        self.assertEqual(render(row, "012345", 300, schema), "\n".join([
            "⚠️ 操作确认", "", "技能：email", "参数：", "· 收件人：a@b.c", "· n：2",
            "· 未声明参数 x：\\u{2066}evil ⚠️含特殊字符", "",
            "确认码：012345", "回复确认码以继续", "回复 0 或「取消」以取消", "(5分钟内有效，最多3次尝试)"]))
        self.assertIn("(90秒内有效", render(row, "1", 90))
        self.assertIn("· 未声明参数 to：a@b.c\n", render(row, "1", 90))    # no schema: nothing is declared
        empty = approval.Approval(uuid.uuid4(), None, None, "u", "x", {}, "", 3, "pending", None, None)
        self.assertIn("\n参数：\n（无）\n\n确认码：", render(empty, "123456", 300))

    def test_the_model_cannot_choose_a_label(self):
        """Extra properties a schema allows come last, under their key, marked as undeclared."""
        schema = {"type": "object", "properties": {"command": {"title": "命令"}, "cwd": {}},
                  "additionalProperties": True}
        params = {"安全评估": "只读操作，无风险（系统已自动审核）", "command": "rm -rf ~", "cwd": "/", "ａ\u200b": "[1]"}
        row = approval.Approval(uuid.uuid4(), None, None, "u", "execute_shell", params, "", 3, "pending", None, None)
        body = render(row, "012345", 300, schema).split("\n")[4:8]
        self.assertEqual(body, ["· 命令：rm -rf ~", "· cwd：/", "· 未声明参数 安全评估：只读操作，无风险（系统已自动审核）",
                                "· 未声明参数 \\u{ff41}\\u{200b}：[1] ⚠️含特殊字符"])
        titled = {"type": "object", "properties": {"to": {"title": "收\u0456件人"}}}
        row = approval.Approval(uuid.uuid4(), None, None, "u", "email", {"to": "a@b.c"}, "", 3, "pending", None, None)
        self.assertIn("\n· 收\\u{0456}件人：a@b.c ⚠️含特殊字符\n", render(row, "012345", 300, titled))

    def test_values_that_are_not_text(self):
        row = approval.Approval(uuid.uuid4(), None, None, "u", "s", {"a": ["x\ny", {"k": "\u0430"}], "b": None},
                                "", 3, "pending", None, None)
        message = render(row, "012345", 300, {"properties": {"a": {}, "b": {}}})
        self.assertIn('\n· a：["x\\\\ny", {"k": "\\u{0430}"}] ⚠️含特殊字符\n· b：null\n', message)

    def test_no_parameter_can_forge_a_line_of_the_message(self):
        schema = {"type": "object", "properties": {"note": {"title": "确认码"}}}
        params = {"确认码": "000000", "note": "111111", "x": "ok\n\n确认码：222222\n回复确认码以继续",
                  "技能": "mark_low", "y": "a\r确认码：333333", "z": "\u2028确认码：444444",
                  "w": "b ⚠️含特殊字符"}
        row = approval.Approval(uuid.uuid4(), None, None, "u", "mark_high", params, "", 3, "pending", None, None)
        message = render(row, "987654", 300, schema)
        lines = message.split("\n")
        self.assertEqual([line for line in lines if line.startswith("确认码")], ["确认码：987654"])
        self.assertEqual([line for line in lines if line.startswith("技能")], ["技能：mark_high"])
        self.assertEqual(len(lines), 9 + len(params))
        body = lines[lines.index("参数：") + 1:lines.index("参数：") + 1 + len(params)]
        self.assertTrue(all(line.startswith("· ") for line in body), body)
        self.assertEqual(body[0], "· 「确认码」：111111")                      # a title that echoes the message is quoted
        self.assertIn("· 未声明参数 确认码：000000", body)
        self.assertIn("· 未声明参数 技能：mark_low", body)
        self.assertIn("· 未声明参数 x：ok\\n\\n确认码：222222\\n回复确认码以继续 ⚠️含特殊字符", body)
        self.assertIn("· 未声明参数 w：b \\u{26a0}\\u{fe0f}含特殊字符 ⚠️含特殊字符", body)   # the mark cannot be forged

    def test_hash_binds_everything(self):
        key = b"k" * 32
        base = ("id", "u", "s", {"a": 1}, "123456")
        h = code_hash(key, *base)
        self.assertTrue(h.startswith("v1:"))
        for i, other in enumerate(("id2", "u2", "s2", {"a": 2}, "123457")):
            changed = list(base)
            changed[i] = other
            self.assertNotEqual(code_hash(key, *changed), h)
        self.assertNotEqual(code_hash(b"j" * 32, *base), h)


class KeyFileTest(unittest.TestCase):
    def test_created_0600_and_reused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sub" / "secret.key"
            key = load_key(path)
            self.assertGreaterEqual(len(key), 32)
            self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)
            self.assertEqual(load_key(path), key)

    def test_processes_starting_together_all_get_the_one_whole_key(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "secret.key"
            script = f"from ias.approval import load_key; print(load_key({str(path)!r}).decode())"
            procs = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(12)]
            results = [proc.communicate(timeout=30) for proc in procs]
            self.assertEqual([err for _, err in results], [""] * 12)
            self.assertEqual({out for out, _ in results}, {path.read_text()})
            self.assertEqual(os.listdir(tmp), ["secret.key"])        # no draft left behind

    def test_refuses_readable_or_short_keys(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "k"
            path.write_text("x" * 40)
            os.chmod(path, 0o644)
            with self.assertRaisesRegex(ConfigError, "readable by others"):
                load_key(path)
            os.chmod(path, 0o600)
            path.write_text("short")
            with self.assertRaisesRegex(ConfigError, "shorter than 32"):
                load_key(path)


class OutcomeTest(GateTestCase):
    async def test_right_code_runs_and_returns_the_result(self):
        task = self.call_high(note="hello")
        code = await self.owner.code()
        self.assertEqual(await self.approvals.redeem("owner", code), "已确认，正在执行：mark_high")
        self.assertEqual(await task, {"success": True, "note": "hello"})
        self.assertEqual(self.runs(), 1)
        [row] = await self.store.approvals(include_closed=True)
        self.assertEqual((row.status, row.attempts_left, row.result), ("approved", 3, {"success": True, "note": "hello"}))
        self.assertIsNotNone(row.consumed_at)

    async def test_wrong_wrong_right(self):
        task = self.call_high()
        code = await self.owner.code()
        wrong = f"{(int(code) + 1) % 10 ** 6:06d}"
        self.assertEqual(await self.approvals.redeem("owner", wrong), "确认码错误，还剩 2 次")
        self.assertEqual(await self.approvals.redeem("owner", wrong), "确认码错误，还剩 1 次")
        await self.approvals.redeem("owner", code)
        self.assertEqual((await task)["success"], True)
        self.assertEqual(self.runs(), 1)

    async def test_three_wrong_codes_reject(self):
        task = self.call_high()
        code = await self.owner.code()
        wrong = f"{(int(code) + 5) % 10 ** 6:06d}"
        for _ in range(2):
            await self.approvals.redeem("owner", wrong)
        self.assertEqual(await self.approvals.redeem("owner", wrong), "确认码错误，操作已取消：mark_high")
        self.assertEqual(await task, REJECTED)
        self.assertEqual(self.runs(), 0)
        [row] = await self.store.approvals(include_closed=True)
        self.assertEqual((row.status, row.attempts_left), ("rejected", 0))
        self.assertIsNone(await self.approvals.redeem("owner", code))          # nothing waits any more

    async def test_cancel_words(self):
        for word in ("0", "取消", "０"):
            task = self.call_high()
            await self.owner.code()
            self.assertEqual(await self.approvals.redeem("owner", word), "已取消：mark_high")
            self.assertEqual(await task, REJECTED)
        self.assertEqual(self.runs(), 0)

    async def test_full_width_code_accepted(self):
        task = self.call_high()
        code = await self.owner.code()
        await self.approvals.redeem("owner", code.translate(str.maketrans("0123456789", "０１２３４５６７８９")))
        self.assertTrue((await task)["success"])

    async def test_arabic_indic_digits_and_other_text_cost_no_attempt(self):
        task = self.call_high()
        code = await self.owner.code()
        arabic = code.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
        for text in (arabic, "好的", "12345", "确认"):
            reply = await self.approvals.redeem("owner", text)
            self.assertIn("正在等待确认（mark_high）", reply)
        [row] = await self.store.approvals()
        self.assertEqual(row.attempts_left, 3)
        await self.approvals.redeem("owner", code)
        self.assertTrue((await task)["success"])

    async def test_timeout(self):
        self.approvals.timeout = 0.3
        task = self.call_high()
        await self.owner.code()
        self.assertEqual(await asyncio.wait_for(task, 5), EXPIRED)
        [row] = await self.store.approvals(include_closed=True)
        self.assertEqual(row.status, "expired")
        self.assertIn("(0.3秒内有效", self.owner.messages[0])
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "timeout"), events)

    async def test_code_after_expiry_does_not_run(self):
        self.approvals.timeout = 0.3
        task = self.call_high()
        code = await self.owner.code()
        await task
        self.assertIsNone(await self.approvals.redeem("owner", code))   # nothing waits any more
        self.assertEqual(self.runs(), 0)

    async def test_a_wall_clock_jump_does_not_end_a_pending_approval(self):
        """A Pi without RTC: the wall clock jumps 2 minutes ahead while the owner reads the message.

        The row's expires_at was stamped by the database's wall clock; moving it 2 minutes back is
        exactly what a +2 min jump of that clock does to `expires_at > clock_timestamp()`. The
        daemon's deadline is monotonic, so the codes keep working: a wrong one spends an attempt,
        the right one approves, once.
        """
        task = self.call_high(note="jump")
        code = await self.owner.code()
        self.sql("UPDATE pending_approvals SET expires_at = expires_at - interval '2 minutes'")
        wrong = f"{(int(code) + 3) % 10 ** 6:06d}"
        self.assertEqual(await self.approvals.redeem("owner", wrong), "确认码错误，还剩 2 次")
        self.assertEqual(await self.approvals.redeem("owner", code), "已确认，正在执行：mark_high")
        self.assertEqual(await task, {"success": True, "note": "jump"})
        self.assertEqual(await self.approvals.redeem("owner", code), None)
        self.assertEqual(self.runs(), 1)

    async def test_a_code_past_the_monotonic_deadline_does_not_run(self):
        """The monotonic deadline decides, even before the timer that ends the wait has fired."""
        clock = FakeClock(datetime(2026, 3, 2, tzinfo=timezone.utc))
        self.approvals.monotonic = clock.monotonic
        task = self.call_high()
        code = await self.owner.code()
        clock.seconds += self.approvals.timeout          # the real timer (5 s) is still far off
        self.assertEqual(await self.approvals.redeem("owner", code), "该操作已结束：mark_high")
        self.assertEqual(await asyncio.wait_for(task, 1), EXPIRED)
        self.assertEqual(self.runs(), 0)
        [row] = await self.store.approvals(include_closed=True)
        self.assertEqual(row.status, "expired")
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "timeout"), events)
        self.assertNotIn("approval_approved", [event for event, _ in events])

    async def test_same_right_code_twice_runs_once(self):
        task = self.call_high()
        code = await self.owner.code()
        await self.approvals.redeem("owner", code)
        await self.approvals.redeem("owner", code)
        await task
        await self.approvals.redeem("owner", code)
        self.assertEqual(self.runs(), 1)

    async def test_sixteen_concurrent_right_replies_run_once(self):
        task = self.call_high()
        code = await self.owner.code()
        replies = await asyncio.gather(*(self.approvals.redeem("owner", code) for _ in range(16)))
        await task
        self.assertEqual(replies.count("已确认，正在执行：mark_high"), 1)
        self.assertEqual(self.runs(), 1)
        approved = [r for r in await self.store.audit_rows() if r.event == "approval_approved"]
        self.assertEqual(len(approved), 1)

    async def test_ten_concurrent_wrong_replies_use_exactly_three_attempts(self):
        task = self.call_high()
        code = await self.owner.code()
        wrong = f"{(int(code) + 7) % 10 ** 6:06d}"
        await asyncio.gather(*(self.approvals.redeem("owner", wrong) for _ in range(10)))
        self.assertEqual(await task, REJECTED)
        [row] = await self.store.approvals(include_closed=True)
        self.assertEqual((row.status, row.attempts_left), ("rejected", 0))
        wrong_rows = [r for r in await self.store.audit_rows() if r.event in ("approval_wrong_code", "approval_rejected")]
        self.assertEqual(len(wrong_rows), 3)

    async def test_another_users_message_never_counts(self):
        task = self.call_high(user="owner")
        code = await self.owner.code()
        self.assertIsNone(await self.approvals.redeem("mallory", code))
        self.assertIsNone(await self.approvals.redeem("mallory", "0"))
        # Even straight at the store, the compare-and-set is bound to the approval's user.
        [row] = await self.store.approvals()
        self.assertIsNone(await self.store.approve(replace(row, user_id="mallory"), row.code_hash, AuditEntry("x")))
        self.assertEqual(row.attempts_left, 3)
        await self.approvals.redeem("owner", code)
        self.assertTrue((await task)["success"])

    async def test_delivery_failure_ends_at_once(self):
        owner = type(self.owner)(deliver=False)
        result = await asyncio.wait_for(self.call_high(notify=owner.notify), 5)
        self.assertEqual(result, EXPIRED)
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "delivery_failed"), events)
        self.assertIsNone(await self.approvals.redeem("owner", "123456"))      # nothing waits any more

    async def test_no_channel_means_not_confirmed(self):
        result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker)}, None)
        self.assertEqual(result, EXPIRED)

    async def test_one_pending_per_user_further_calls_queue(self):
        asked: list[list[str]] = []       # the stored statuses whenever the owner is asked

        async def notify(text: str) -> bool:
            asked.append(sorted(row.status for row in await self.store.approvals(include_closed=True)))
            return await self.owner.notify(text)
        first = self.call_high(note="first", notify=notify)
        code1 = await self.owner.code()
        second = self.call_high(note="second", notify=notify)
        await self.approvals.redeem("owner", code1)
        self.assertEqual((await first)["note"], "first")
        code2 = await self.owner.code()
        await self.approvals.redeem("owner", code2)
        self.assertEqual((await second)["note"], "second")
        self.assertEqual(self.marker.read_text(), "first\nsecond\n")
        self.assertEqual([statuses.count("pending") for statuses in asked], [1, 1])   # the second waited its turn
        self.assertEqual(len(asked[1]), 2)

    async def test_a_pending_approval_in_another_process_denies_the_call(self):
        other, asked = self.build().approvals, FakeOwner()   # e.g. `ias run` while the daemon waits
        first = asyncio.create_task(other.request("owner", self.registry.get("mark_high"),
                                                  {"marker": str(self.marker)}, asked.notify))
        await asked.code()
        self.assertEqual(await self.call_high(), EXPIRED)
        self.assertEqual(self.owner.messages, [])
        first.cancel()

    async def test_invalid_params_never_reach_the_owner(self):
        result = await self.gate.call("owner", "mark_high", {"marker": 5}, self.owner.notify)
        self.assertEqual(result["success"], False)
        self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.owner.messages, [])
        self.assertEqual(await self.store.approvals(include_closed=True), [])

    async def test_restart_expires_leftovers(self):
        task = self.call_high()
        await self.owner.code()
        task.cancel()
        fresh = self.build().approvals
        [row] = await fresh.expire_leftovers()
        self.assertEqual(row.skill_name, "mark_high")
        [stored] = await self.store.approvals(include_closed=True)
        self.assertEqual(stored.status, "expired")
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "restart"), events)

    async def test_restart_expires_every_leftover_and_audits_it_redacted(self):
        users = [f"user{i}" for i in range(60)]              # more than one page of `store.approvals()`
        for user in users:
            await self.store.create_approval(uuid.uuid4(), user, "mark_high", {"api_token": "sk-x", "note": user}, 60,
                                             "v1:h", AuditEntry("approval_requested", user_id=user))
        expired = await Approvals(self.store, self.key, 5).expire_leftovers()
        self.assertEqual(sorted(row.user_id for row in expired), sorted(users))
        self.assertEqual({row.status for row in await self.store.approvals(include_closed=True, limit=None)}, {"expired"})
        rows = [r for r in await self.store.audit_rows() if r.event == "approval_expired"]
        self.assertEqual(sorted((r.user_id, r.detail, r.decision, r.risk) for r in rows),
                         sorted((user, "restart", "expired", None) for user in users))
        self.assertEqual({json.dumps(r.params, sort_keys=True) for r in rows if r.params["note"] == "user7"},
                         {'{"api_token": "***", "note": "user7"}'})
        self.assertEqual(await Approvals(self.store, self.key, 5).expire_leftovers(), [])

    async def test_code_hash_is_not_a_bare_sha256(self):
        task = self.call_high()
        code = await self.owner.code()
        [row] = await self.store.approvals()
        version, digest = row.code_hash.split(":")
        self.assertEqual(version, "v1")
        bare = hashlib.sha256(code.encode()).hexdigest()    # what a table of the 10**6 codes' sha256 would find
        self.assertNotIn(bare, (digest, row.code_hash))
        await self.approvals.redeem("owner", code)
        await task


class NotAskedTest(GateTestCase):
    """Calls the owner is never asked about: a message too long for WeChat, a turn past its approvals."""

    async def assertRefused(self, decision: str) -> None:
        self.assertEqual(self.owner.messages, [])
        self.assertEqual(self.runs(), 0)
        self.assertEqual(await self.store.approvals(include_closed=True), [])
        rows = [(r.event, r.decision, r.skill_name) for r in await self.store.audit_rows()]
        self.assertIn(("approval_refused", decision, "mark_high"), rows)

    async def test_a_message_longer_than_one_wechat_message_is_not_asked(self):
        for note in ("x" * 4000, "\u3000" * 700):        # 700 characters, but 4,200 once escaped
            with self.subTest(length=len(note)):
                result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker), "note": note},
                                              self.owner.notify)
                self.assertEqual(result, TOO_LONG)
                await self.assertRefused("too_long")

    async def test_a_message_just_within_the_limit_is_asked(self):
        probe = approval.Approval(uuid.uuid4(), None, None, "owner", "mark_high",
                                  {"marker": str(self.marker), "note": ""}, "", 3, "pending", None, None)
        room = 4000 - len(render(probe, "000000", self.approvals.timeout, self.registry.get("mark_high").parameters))
        task = self.call_high(note="y" * room)
        code = await self.owner.code()
        self.assertEqual(len(self.owner.messages[0]), 4000)
        await self.approvals.redeem("owner", code)
        self.assertTrue((await task)["success"])
        result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker), "note": "y" * (room + 1)},
                                      self.owner.notify)
        self.assertEqual(result, TOO_LONG)

    async def test_at_most_three_approvals_per_owner_message(self):
        turn = TurnBudget()
        for i in range(3):
            task = asyncio.create_task(self.gate.call("owner", "mark_high", {"marker": str(self.marker), "note": str(i)},
                                                      self.owner.notify, turn))
            await self.approvals.redeem("owner", await self.owner.code())
            self.assertTrue((await task)["success"])
        for _ in range(2):
            result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker), "note": "more"},
                                          self.owner.notify, turn)
            self.assertEqual(result, TOO_MANY)
        self.assertEqual((len(self.owner.messages), self.runs()), (3, 3))
        self.assertEqual(len(await self.store.approvals(include_closed=True)), 3)
        refused = [r.decision for r in await self.store.audit_rows() if r.event == "approval_refused"]
        self.assertEqual(refused, ["too_many", "too_many"])
        # Low calls are not counted, and the next owner message starts afresh.
        self.assertTrue((await self.gate.call("owner", "echo_low", {}, self.owner.notify, turn))["success"])
        task = asyncio.create_task(self.gate.call("owner", "mark_high", {"marker": str(self.marker)},
                                                  self.owner.notify, TurnBudget()))
        await self.approvals.redeem("owner", await self.owner.code())
        self.assertTrue((await task)["success"])


class ApprovingOwner(FakeOwner):
    """An owner who answers every confirmation message with its code (or with `reply`)."""

    def __init__(self, approvals, reply: str | None = None):
        super().__init__()
        self.approvals = approvals
        self.reply = reply
        self.codes: list[str] = []
        self.answers: list[asyncio.Task] = []

    async def notify(self, text: str) -> bool:
        await super().notify(text)
        code = CODE_LINE.search(text).group(1)
        self.codes.append(code)
        self.answers.append(asyncio.create_task(self.approvals.redeem("owner", self.reply or code)))
        return True


# Words about confirmations, approvals or codes; none may reach the model. The only exceptions
# are SPEC's fixed result strings, which say that a call did not run.
TELLTALES = re.compile(r"(?i)确认|审批|批准|验证码|授权码|approv|confirm|\bcodes?\b|\b2fa\b|\botp\b")
RESULT_STRINGS = ("用户拒绝了你的调用：", "用户没有确认操作：", "参数过长，无法请求确认：", "本轮待确认操作过多，未请求确认：")


class ModelNeverHearsOfCodesTest(test_agent.AgentTestCase):
    """Every request body the model receives during High calls, scanned for approval talk."""

    def assertModelHeardNothing(self, codes: list[str]) -> None:
        self.assertTrue(self.requests)
        for request in self.requests:
            body = json.dumps(request, ensure_ascii=False)
            for fixed in RESULT_STRINGS:
                body = body.replace(fixed, "")
            self.assertIsNone(TELLTALES.search(body), TELLTALES.search(body) and
                              body[max(0, TELLTALES.search(body).start() - 80):TELLTALES.search(body).end() + 80])
            for code in codes:
                self.assertNotIn(code, body)

    def test_no_shipped_tool_definition_mentions_them(self):
        from ias.catalog import tool_spec
        from ias.registry import load_registry
        registry = load_registry(test_agent.REPO / "resources" / "skills", test_agent.REPO / "skills")
        self.assertGreaterEqual(len(list(registry)), 10)
        for skill in registry:
            spec = json.dumps(tool_spec(skill), ensure_ascii=False)
            self.assertIsNone(TELLTALES.search(spec), skill.name)

    async def test_five_high_calls_in_one_reply(self):
        owner = ApprovingOwner(self.approvals)
        self.model.script(ask(*[("mark_high", {"marker": str(self.marker), "note": f"n{i}"}) for i in range(5)]),
                          answer("好了。"))
        self.assertEqual(await self.agent.turn("owner", "标记五次", owner.notify), "好了。")
        await asyncio.gather(*owner.answers)
        self.assertEqual((len(owner.messages), self.runs()), (3, 3))
        results = [json.loads(m["content"]) for m in self.tool_messages()]
        self.assertEqual(results, [{"success": True, "note": f"n{i}"} for i in range(3)] + [TOO_MANY] * 2)
        self.assertModelHeardNothing(owner.codes)
        # The next owner message may ask again.
        self.model.script(ask(("mark_high", {"marker": str(self.marker), "note": "again"})), answer("又标记了。"))
        self.assertEqual(await self.agent.turn("owner", "再来一次", owner.notify), "又标记了。")
        self.assertEqual(self.runs(), 4)
        self.assertModelHeardNothing(owner.codes)

    async def test_rejected_expired_and_too_long(self):
        self.approvals.timeout = 0.3
        canceller = ApprovingOwner(self.approvals, reply="0")
        self.model.script(ask(("mark_high", {"marker": str(self.marker)}),
                              ("mark_high", {"marker": str(self.marker), "note": "z" * 5000})), answer("没做。"))
        await self.agent.turn("owner", "标记", canceller.notify)
        await asyncio.gather(*canceller.answers)
        silent = FakeOwner()
        self.model.script(ask(("mark_high", {"marker": str(self.marker)})), answer("没人回。"))
        await self.agent.turn("owner", "标记", silent.notify)
        results = [json.loads(m["content"]) for m in self.tool_messages()]
        self.assertEqual(results, [REJECTED, TOO_LONG, EXPIRED])
        self.assertEqual(self.runs(), 0)
        codes = canceller.codes + [CODE_LINE.search(m).group(1) for m in silent.messages]
        self.assertEqual(len(codes), 2)
        self.assertModelHeardNothing(codes)


class CodeSecrecyTest(GateTestCase):
    async def test_code_appears_only_in_the_message_to_the_owner(self):
        records = capture_logs(self)
        task = self.call_high(note="x", api_token="sk-secret-value")
        code = await self.owner.code()
        wrong = f"{(int(code) + 1) % 10 ** 6:06d}"
        await self.approvals.redeem("owner", wrong)
        await self.approvals.redeem("owner", code)
        result = await task
        self.assertEqual([m for m in self.owner.messages if code in m], self.owner.messages[:1])
        self.assertNotIn(code, json.dumps(result, ensure_ascii=False))
        for record in records:
            self.assertNotIn(code, record.getMessage())
        dump = self.sql("SELECT string_agg(t::text, '\n') FROM (SELECT * FROM audit_log) t")[0][0]
        dump += "\n".join(str(r) for r in self.sql(
            "SELECT id, created_at, expires_at, user_id, skill_name, params, attempts_left, status, result "
            "FROM pending_approvals"))
        dump += str(self.sql("SELECT * FROM messages")) + str(self.sql("SELECT * FROM channel_state"))
        self.assertNotIn(code, dump)
        self.assertNotIn("sk-secret-value", self.sql("SELECT string_agg(params::text, '') FROM audit_log")[0][0])


class AuditTest(StoreTestCase):
    async def test_chain_verifies_and_detects_tampering(self):
        from ias import audit
        for i in range(5):
            await self.store.audit(AuditEntry("skill_finished", user_id="u", skill_name="s", exit_code=i))
        self.assertEqual(await audit.verify(self.store), [])
        for statement in ("UPDATE audit_log SET exit_code = 9", "DELETE FROM audit_log", "TRUNCATE audit_log"):
            with self.assertRaisesRegex(Exception, "append-only"):
                self.sql(statement)
        self.sql("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
        self.sql("UPDATE audit_log SET exit_code = 42 WHERE exit_code = 2")
        [[altered]] = self.sql("SELECT id FROM audit_log WHERE exit_code = 42")
        self.assertEqual(await audit.verify(self.store),
                         [f"row {altered}: contents do not match its keyed hash (row altered or re-chained)"])
        self.sql("DELETE FROM audit_log WHERE exit_code = 3")
        problems = await audit.verify(self.store)
        self.assertTrue(any("chain broken" in p for p in problems), problems)

    async def test_concurrent_writers_keep_one_chain(self):
        from ias import audit
        await asyncio.gather(*(self.store.audit(AuditEntry("e", detail=str(i))) for i in range(40)))
        self.assertEqual(await audit.verify(self.store), [])
        self.assertEqual(len(await self.store.audit_rows()), 40)

    def test_redact(self):
        from ias.audit import redact
        self.assertEqual(redact({"password": "p", "nested": {"API_KEY": "k", "ok": 1}, "list": [{"Cookie": "c"}],
                                 "to": "a@b"}),
                         {"password": "***", "nested": {"API_KEY": "***", "ok": 1}, "list": [{"Cookie": "***"}],
                          "to": "a@b"})


if __name__ == "__main__":
    unittest.main()

"""The approval gate against real PostgreSQL: every outcome, races, and where the code may appear."""
import asyncio
import hashlib
import json
import os
import stat
import tempfile
import unittest
import uuid
from pathlib import Path

from ias import approval
from ias.approval import Approvals, code_hash, escape_visible, load_key, parse_reply, render
from ias.errors import ConfigError
from ias.store import AuditEntry
from tests.support import FakeOwner, GateTestCase, StoreTestCase, capture_logs

REJECTED = {"success": False, "error": "用户拒绝了你的调用：mark_high"}
EXPIRED = {"success": False, "error": "用户没有确认操作：mark_high"}


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
        self.assertEqual(escape_visible("a\nb\tc\u202ed\u200be\x00"), "a\\nb\\tc\\u202ed\\u200be\\u0000")
        self.assertEqual(escape_visible("rm -rf ~/照片"), "rm -rf ~/照片")

    def test_render(self):
        row = approval.Approval(uuid.uuid4(), None, None, "u", "email", {"to": "a@b.c", "n": 2, "x": "\u2066evil"},
                                "", 3, "pending", None, None)
        self.assertEqual(render(row, "012345", 300), "\n".join([
            "⚠️ 操作确认", "技能：email", "参数：", "n: 2", "to: a@b.c", "x: \\u2066evil",
            "确认码：012345", "回复确认码以继续", "回复 0 或「取消」以取消", "(5分钟内有效，最多3次尝试)"]))
        self.assertIn("(90秒内有效", render(row, "1", 90))

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
        self.assertFalse(self.approvals.waiting("owner"))

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
        self.assertIsNone(await self.store.approve(row.id, "mallory", lambda r: AuditEntry("x")))
        self.assertEqual(row.attempts_left, 3)
        await self.approvals.redeem("owner", code)
        self.assertTrue((await task)["success"])

    async def test_edited_params_no_longer_verify(self):
        task = self.call_high(note="harmless")
        code = await self.owner.code()
        self.sql("UPDATE pending_approvals SET params = jsonb_set(params, '{note}', '\"evil\"')")
        self.assertEqual(await self.approvals.redeem("owner", code), "确认码错误，还剩 2 次")
        self.assertEqual(await self.approvals.redeem("owner", "0"), "已取消：mark_high")
        self.assertEqual(await task, REJECTED)
        self.assertEqual(self.runs(), 0)

    async def test_delivery_failure_ends_at_once(self):
        owner = type(self.owner)(deliver=False)
        result = await asyncio.wait_for(self.call_high(notify=owner.notify), 5)
        self.assertEqual(result, EXPIRED)
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "delivery_failed"), events)
        self.assertFalse(self.approvals.waiting("owner"))

    async def test_no_channel_means_not_confirmed(self):
        result = await self.gate.call("owner", "mark_high", {"marker": str(self.marker)}, None)
        self.assertEqual(result, EXPIRED)

    async def test_one_pending_per_user_further_calls_queue(self):
        first = self.call_high(note="first")
        code1 = await self.owner.code()
        second = self.call_high(note="second")
        await asyncio.sleep(0.2)
        self.assertEqual(len(self.owner.messages), 1)          # the second waits its turn
        self.assertEqual(len(await self.store.approvals()), 1)
        await self.approvals.redeem("owner", code1)
        self.assertEqual((await first)["note"], "first")
        code2 = await self.owner.code()
        await self.approvals.redeem("owner", code2)
        self.assertEqual((await second)["note"], "second")
        self.assertEqual(self.marker.read_text(), "first\nsecond\n")

    async def test_a_pending_approval_in_another_process_denies_the_call(self):
        other, asked = Approvals(self.store, self.key, 5), FakeOwner()   # e.g. `ias run` while the daemon waits
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
        fresh = Approvals(self.store, self.key, 5)
        [row] = await fresh.expire_leftovers()
        self.assertEqual(row.skill_name, "mark_high")
        [stored] = await self.store.approvals(include_closed=True)
        self.assertEqual(stored.status, "expired")
        events = [(r.event, r.detail) for r in await self.store.audit_rows()]
        self.assertIn(("approval_expired", "restart"), events)

    async def test_code_hash_is_not_a_bare_sha256(self):
        task = self.call_high()
        code = await self.owner.code()
        [row] = await self.store.approvals()
        version, digest = row.code_hash.split(":")
        self.assertEqual(version, "v1")
        candidates = await asyncio.to_thread(
            lambda: {hashlib.sha256(f"{i:06d}".encode()).hexdigest() for i in range(10 ** 6)})
        self.assertNotIn(digest, candidates)
        self.assertNotIn(row.code_hash, candidates)
        await self.approvals.redeem("owner", code)
        await task


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
        self.assertEqual(await audit.verify(self.store), [f"row {altered}: contents do not match its hash (row altered)"])
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

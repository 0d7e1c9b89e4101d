"""What the model sees (SPEC §5–6), from facts alone: no process, no database."""
import json
import unittest

from ias import results
from ias.limits import ERROR_TAIL, OUTPUT_HELD_MAX, STDOUT_TO_LLM, TOOL_RESULT_MAX
from ias.runner import RunResult


def run(**facts) -> RunResult:
    """A RunResult for skill `s` that exited 0 with no output, but for `facts`."""
    base = dict(skill="s", exit_code=0, stdout="", stderr="", timed_out=False, overflowed=False, timeout=30.0,
                duration=0.1, output_size=len(facts.get("stdout", "").encode()), started_at=0.0)
    return RunResult(**{**base, **facts})


class OfRunTest(unittest.TestCase):
    def test_exit_zero(self):
        self.assertEqual(results.of_run(run(stdout='{"success": false, "why": 1}')), {"success": False, "why": 1})
        self.assertEqual(results.of_run(run(stdout="plain\n")), {"success": True, "output": "plain\n"})
        self.assertEqual(results.of_run(run(stdout='{"ok": 1}')), {"success": True, "output": '{"ok": 1}'})
        deep = "[" * 10_000 + "]" * 10_000                # no RecursionError: plain output
        self.assertEqual(results.of_run(run(stdout=deep))["success"], True)

    def test_exit_non_zero(self):
        self.assertEqual(results.of_run(run(exit_code=2, stderr="bad\n", stdout="out")),
                         {"success": False, "error": "bad", "exit_code": 2})
        self.assertEqual(results.of_run(run(exit_code=2, stdout="  out \n")),
                         {"success": False, "error": "out", "exit_code": 2})
        self.assertEqual(results.of_run(run(exit_code=-9)),
                         {"success": False, "error": "技能执行失败（退出码 -9）：s", "exit_code": -9})
        self.assertEqual(results.of_run(run(exit_code=1, stderr="x" * 5000 + "END"))["error"],
                         ("x" * 5000 + "END")[-ERROR_TAIL:])

    def test_timeout_and_overflow(self):
        self.assertEqual(results.of_run(run(timed_out=True, timeout=2.5, exit_code=-15)),
                         {"success": False, "error": "技能执行超时（2.5s）：s"})
        flood = run(overflowed=True, exit_code=-9, stdout="a" * 10, output_size=OUTPUT_HELD_MAX + 1)
        self.assertEqual(results.of_run(flood), {"success": False, "error": "技能输出超过上限（1 MiB），已终止：s",
                                                 "truncated": True})
        self.assertTrue(results.truncated(flood))

    def test_output_past_what_the_model_may_see(self):
        big = run(stdout="é" * STDOUT_TO_LLM, output_size=2 * STDOUT_TO_LLM)
        result = results.of_run(big)
        self.assertEqual(result, {"success": True, "output": "é" * (STDOUT_TO_LLM // 2), "truncated": True})
        self.assertTrue(results.truncated(big))
        self.assertFalse(results.truncated(run(stdout="a" * STDOUT_TO_LLM)))


class RefusalTest(unittest.TestCase):
    def test_every_string_of_spec_5_and_6(self):
        self.assertEqual(results.unknown_skill("x"), {"success": False, "error": "未知技能：x"})
        self.assertEqual(results.invalid(["$.a: bad", "$.b: worse"]),
                         {"success": False, "error": "参数错误：$.a: bad；$.b: worse"})
        self.assertEqual(results.refused("too_long", "x"), {"success": False, "error": "参数过长，无法请求确认：x"})
        self.assertEqual(results.refused("too_many", "x"),
                         {"success": False, "error": "本轮待确认操作过多，未请求确认：x"})
        self.assertEqual(results.refused("rejected", "x"), {"success": False, "error": "用户拒绝了你的调用：x"})
        self.assertEqual(results.refused("expired", "x"), {"success": False, "error": "用户没有确认操作：x"})
        self.assertEqual(results.interrupted("x"), {"success": False, "error": "技能执行被中断：x"})

    def test_any_other_outcome_is_not_confirmed(self):
        """Fail closed: a status the gate does not know never reads as a run."""
        self.assertEqual(results.refused("something new", "x"), {"success": False, "error": "用户没有确认操作：x"})


class ForHistoryTest(unittest.TestCase):
    def test_a_short_result_is_kept_whole(self):
        result = {"success": True, "output": "汉字"}
        self.assertEqual(results.for_history(result), json.dumps(result, ensure_ascii=False))

    def test_the_longest_strings_are_cut_and_the_rest_survives(self):
        result = {"success": True, "body": "b" * 40_000, "subject": "s" * 200, "attachments": ["a.pdf"]}
        content = results.for_history(result)
        self.assertLessEqual(len(content), TOOL_RESULT_MAX)
        kept = json.loads(content)
        self.assertEqual((kept["subject"], kept["attachments"], kept["truncated"]), ("s" * 200, ["a.pdf"], True))
        self.assertTrue(kept["body"].startswith("bbb") and kept["body"].endswith("…"))

    def test_bulk_in_nested_values_cuts_the_text(self):
        content = results.for_history({"success": True, "items": ["x" * 100] * 500}, limit=1000)
        self.assertEqual(len(content), 1000 + len("…(truncated)"))
        self.assertTrue(content.endswith("…(truncated)"))


if __name__ == "__main__":
    unittest.main()

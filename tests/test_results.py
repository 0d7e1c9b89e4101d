"""What the model sees (SPEC §5–6), from facts alone: no process, no database."""
import json
import time
import unittest

from ias import results
from ias.limits import ARGUMENTS_MAX, ERROR_TAIL, OUTPUT_HELD_MAX, STDOUT_TO_LLM, TOOL_NAME_SHOWN, TOOL_RESULT_MAX
from ias.outcome import RunResult


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

    def test_a_handler_answer_as_is_until_it_passes_what_the_model_may_see(self):
        small = {"success": True, "tasks": []}
        self.assertIs(results.of_handler(small), small)
        big = results.of_handler({"success": True, "text": "中" * STDOUT_TO_LLM})
        self.assertEqual((big["success"], big["truncated"]), (True, True))
        self.assertLessEqual(len(big["output"].encode()), STDOUT_TO_LLM)

    def test_every_executor_times_out_and_fails_in_the_same_words(self):
        self.assertEqual(results.timed_out("s", 2.5), results.of_run(run(timed_out=True, timeout=2.5, exit_code=-15)))
        self.assertEqual(results.mcp_failed("s", "  gone\n"), {"success": False, "error": "MCP 服务调用失败：s：gone"})
        self.assertEqual(results.handler_failed("no task with id 3"), {"success": False, "error": "no task with id 3"})


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
        self.assertEqual(results.too_long("x"), {"success": False, "error": "参数过长：x"})
        self.assertEqual(results.too_many_calls("x"), {"success": False, "error": "单次调用过多，未执行：x"})

    def test_a_flood_of_a_name_is_cut_where_it_is_echoed(self):
        name = "a" * TOOL_NAME_SHOWN
        self.assertEqual(results.shown_name(name), name)
        self.assertEqual(results.too_many_calls(name + "b")["error"], f"单次调用过多，未执行：{name}…")
        self.assertEqual(results.unknown_skill(name * 100)["error"], f"未知技能：{name}…")

    def test_any_other_outcome_is_not_confirmed(self):
        """Fail closed: a status the gate does not know never reads as a run."""
        self.assertEqual(results.refused("something new", "x"), {"success": False, "error": "用户没有确认操作：x"})


class CallsForHistoryTest(unittest.TestCase):
    """What the history keeps of the model's own calls (SPEC §6.11)."""

    @staticmethod
    def message(*calls: tuple[str, str]) -> dict:
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                               for i, (n, a) in enumerate(calls)]}

    def test_arguments_size_is_bytes_of_json_text(self):
        self.assertEqual(results.arguments_size(None), 0)
        self.assertEqual(results.arguments_size('{"a": 1}'), 8)
        self.assertEqual(results.arguments_size({"a": 1}), len('{"a":1}'))    # compact JSON of an object
        self.assertEqual(results.arguments_size("日"), 3)
        self.assertEqual(results.arguments_size({"s": "\ud800"}), len('{"s":""}') + 3)   # a lone surrogate counts

    def test_calls_within_bounds_are_kept_as_sent(self):
        message = self.message(("a", '{"x": 1}'), ("b", "{not json"))
        self.assertEqual(results.calls_for_history(message), message)
        plain = {"role": "assistant", "content": "hi"}
        self.assertIs(results.calls_for_history(plain), plain)

    def test_refused_calls_keep_id_and_name_only(self):
        long = json.dumps({"t": "x" * ARGUMENTS_MAX})
        kept = results.calls_for_history(self.message(("a", "{}"), ("b", long), ("c", '{"y": 2}'), ("d", long)), run=3)
        self.assertEqual([c["id"] for c in kept["tool_calls"]], ["c0", "c1", "c2", "c3"])
        self.assertEqual([c["function"]["arguments"] for c in kept["tool_calls"]],
                         ["{}", json.dumps({"_omitted": f"参数过长，未保存（{len(long)} 字节）"}, ensure_ascii=False),
                          '{"y": 2}', "{}"])
        self.assertLess(len(json.dumps(kept)), 1000)

    def test_names_are_cut(self):
        kept = results.calls_for_history(self.message(("n" * 100_000, "{}")))
        self.assertEqual(kept["tool_calls"][0]["function"]["name"], "n" * TOOL_NAME_SHOWN + "…")


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

    def test_many_strings_are_cut_in_linear_time(self):
        result = {"success": True, **{f"k{i}": "v" * 8 for i in range(8000)}}     # a skill's 64 KiB JSON object
        started = time.monotonic()
        content = results.for_history(result)
        self.assertLess(time.monotonic() - started, 0.5)
        self.assertEqual(len(content), TOOL_RESULT_MAX + len("…(truncated)"))     # the bulk is in many small strings

    def test_escaped_characters_are_counted_as_written(self):
        result = {"success": True, "a": "\n" * 20_000, "b": "\u0001" * 20_000}
        content = results.for_history(result)
        self.assertLessEqual(len(content), TOOL_RESULT_MAX)
        self.assertFalse(content.endswith("…(truncated)"))      # cut by its strings, still an object
        self.assertTrue(json.loads(content)["truncated"])

    def test_bulk_in_nested_values_cuts_the_text(self):
        content = results.for_history({"success": True, "items": ["x" * 100] * 500}, limit=1000)
        self.assertEqual(len(content), 1000 + len("…(truncated)"))
        self.assertTrue(content.endswith("…(truncated)"))


if __name__ == "__main__":
    unittest.main()

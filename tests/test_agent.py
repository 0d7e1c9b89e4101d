"""The agent: with the model in process (`ScriptedLLM`) for what it does with answers, and with the real
`openai` client against a local OpenAI-compatible server for what the wire brings (errors, stalls, drips,
replies other servers really send)."""
import asyncio
import hashlib
import importlib
import json
import os
import time
import unittest
from datetime import datetime, timezone

from ias.slash import HELP
from ias.agent import APOLOGY, KEY_REFUSED, NO_ANSWER, NO_LLM, TOO_MANY_ROUNDS, TURN_TIMEOUT_REPLY, system_prompt
from ias.channels.base import Inbound
from ias.channels.console import ConsoleChannel
from ias.limits import ARGUMENTS_MAX, AUDIT_VALUE_MAX, TOOL_CALLS_MAX
from ias.llm import LLM, LLMError, Reply
from ias.router import NOTHING_PENDING
from tests.servers.llm import LLMServer, broken, calls, drip, error, raw, stall, text
from tests.servers.qweather import KEY, QWeatherServer
from tests.support import CODE_LINE, FIXTURES, REPO, FakeChannel, GateTestCase, ScriptedLLM, answer, ask, capture_logs

FIXED_NOW = datetime(2026, 12, 2, 1, 30, tzinfo=timezone.utc)       # 09:30 Beijing, a Wednesday


class Screen:
    """A console's stdout: collects what was written and wakes waiters."""

    def __init__(self):
        self.text = ""
        self.changed = asyncio.Event()

    def write(self, s: str) -> None:
        self.text += s
        self.changed.set()

    def flush(self) -> None:
        pass

    async def wait_for(self, needle: str, timeout: float = 10) -> None:
        async def loop():
            while needle not in self.text:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)


class AgentTestCase(GateTestCase):
    """The agent over the shipped and fixture skills; its model `self.llm` is `self.model`, a ScriptedLLM
    checked complete at the end."""
    system_skills = REPO / "resources" / "skills"

    def model_for_test(self):
        self.model = ScriptedLLM()
        return self.model

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.llm = self.model_for_test()
        self.use(self.build(llm=self.llm, now=lambda: FIXED_NOW))

    async def asyncTearDown(self):
        await self.llm.close()
        await super().asyncTearDown()
        self.model.assert_complete()

    @property
    def requests(self) -> list[dict]:
        """Every request the model got, as its JSON body."""
        return self.model.requests

    def tool_messages(self, request: int = -1) -> list[dict]:
        return [m for m in self.requests[request]["messages"] if m["role"] == "tool"]


class WireTestCase(AgentTestCase):
    """The agent with the real client (`self.llm`) against a local endpoint (`self.server`, also `self.model`):
    scripted replies left unused, or problems of the endpoint's own, fail the test."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        importlib.import_module("openai")       # the first request's import is not part of a timed turn

    def model_for_test(self):
        self.server = self.model = LLMServer().start()
        self.addCleanup(self.server.close)
        return LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01, 0.01))

    async def asyncTearDown(self):
        await super().asyncTearDown()
        self.server.check()

    @property
    def requests(self) -> list[dict]:
        return self.server.requests


class ChatTest(AgentTestCase):
    async def test_plain_answer(self):
        self.model.script(answer("你好，主人。"))
        self.assertEqual(await self.agent.turn("owner", "你好", None), "你好，主人。")
        [request] = self.requests
        self.assertEqual(request["model"], "test-model")
        system = request["messages"][0]
        self.assertEqual(system["role"], "system")
        self.assertIn("北京时间 2026-12-02 09:30，星期三", system["content"])
        self.assertEqual(request["messages"][1:], [{"role": "user", "content": "你好"}])
        names = {t["function"]["name"] for t in request["tools"]}
        self.assertLessEqual({"get_current_datetime", "echo_low", "mark_high"}, names)

    async def test_one_tool_call(self):
        self.model.script(ask(("get_current_datetime", {"format": "date"})), answer("今天是星期三。"))
        self.assertEqual(await self.agent.turn("owner", "今天星期几", None), "今天是星期三。")
        [tool] = self.tool_messages()
        result = json.loads(tool["content"])
        self.assertTrue(result["success"])
        self.assertRegex(result["datetime"], r"^\d{4}-\d\d-\d\d 星期.$")
        assistant = self.requests[1]["messages"][-2]
        self.assertEqual(assistant["tool_calls"][0]["id"], tool["tool_call_id"])

    async def test_two_tool_calls_in_one_response(self):
        self.model.script(ask(("echo_low", {"text": "a"}), ("echo_low", {"text": "b"})), answer("done"))
        self.assertEqual(await self.agent.turn("owner", "echo twice", None), "done")
        self.assertEqual([json.loads(t["content"]) for t in self.tool_messages()],
                         [{"success": True, "output": "a"}, {"success": True, "output": "b"}])

    async def test_invalid_arguments_and_unknown_tool(self):
        self.model.script(ask(("echo_low", {"text": 5}), ("echo_low", "{not json"), ("no_such_tool", {})),
                          answer("sorry"))
        await self.agent.turn("owner", "x", None)
        results = [json.loads(t["content"]) for t in self.tool_messages()]
        self.assertTrue(results[0]["error"].startswith("参数错误：$.text: expected string"), results[0])
        self.assertTrue(results[1]["error"].startswith("参数错误：$: arguments are not valid JSON"), results[1])
        self.assertEqual(results[2], {"success": False, "error": "未知技能：no_such_tool"})

    async def test_round_limit(self):
        self.model.repeat_last = True       # the model asks for a tool call forever
        self.model.script(ask(("echo_low", {"text": "again"})))
        self.assertEqual(await self.agent.turn("owner", "loop", None), TOO_MANY_ROUNDS)
        self.assertEqual(len(self.requests), 8)

    async def test_a_failed_endpoint_gives_one_short_apology(self):
        self.model.script(LLMError("LLM endpoint failed 3 times: InternalServerError"))
        reply = await self.agent.turn("owner", "hi", None)
        self.assertEqual(reply, APOLOGY)
        self.assertNotIn("Error", reply)

    async def test_history_across_turns_and_reset(self):
        self.model.script(ask(("echo_low", {"text": "first"})), answer("one"), answer("two"), answer("three"))
        await self.agent.turn("owner", "turn 1", None)
        await self.agent.turn("owner", "turn 2", None)
        second = self.requests[2]["messages"]
        self.assertEqual([m["role"] for m in second], ["system", "user", "assistant", "tool", "assistant", "user"])
        self.assertEqual(second[1]["content"], "turn 1")
        self.assertEqual(second[4]["content"], "one")
        self.assertEqual(await self.agent.turn("owner", "/reset", None), "对话记录已清空。")
        await self.agent.turn("owner", "turn 3", None)
        self.assertEqual([m["role"] for m in self.requests[3]["messages"]], ["system", "user"])
        # Another user's history is separate.
        self.assertEqual(await self.store.recent_messages("someone", 10), [])

    async def test_window_never_starts_with_an_orphan_tool_result(self):
        self.agent.window = 3
        self.model.script(ask(("echo_low", {"text": "x"})), answer("one"), answer("two"))
        await self.agent.turn("owner", "turn 1", None)     # user, assistant+call, tool, assistant
        await self.agent.turn("owner", "turn 2", None)
        roles = [m["role"] for m in self.requests[2]["messages"]]
        self.assertEqual(roles, ["system", "user"])

    async def test_commands_need_no_llm(self):
        agent = self.build().agent
        self.assertEqual(await agent.turn("owner", "/help", None), HELP)
        self.assertIn("mark_high（高风险）", await agent.turn("owner", "/skills", None))
        out = await agent.turn("owner", '/run echo_low {"text": "hey"}', None)
        self.assertEqual(json.loads(out), {"success": True, "output": "hey"})
        self.assertIn("未知命令：/nope", await agent.turn("owner", "/nope", None))
        self.assertEqual(await agent.turn("owner", "hello", None), NO_LLM)
        self.assertEqual(self.requests, [])

    def test_system_prompt_time(self):
        self.assertIn("2026-12-03 07:59", system_prompt(datetime(2026, 12, 2, 23, 59, tzinfo=timezone.utc)))


class EndpointTest(WireTestCase):
    """What the endpoint's failures cost a turn, through the real client."""

    async def test_500_then_200(self):
        self.server.script(error(500), text("recovered"))
        self.assertEqual(await self.agent.turn("owner", "hi", None), "recovered")
        self.assertEqual(len(self.server.requests), 2)

    async def test_endpoint_down_gives_one_short_apology(self):
        self.server.script(error(500), error(502), error(503))
        reply = await self.agent.turn("owner", "hi", None)
        self.assertEqual(reply, APOLOGY)
        self.assertNotIn("Error", reply)

    async def test_bad_key_is_not_retried(self):
        bad = LLM("sk-wrong", self.server.base_url, "test-model", retry_delays=(0.01,))
        agent = self.build(llm=bad).agent
        self.assertEqual(await agent.turn("owner", "hi", None), KEY_REFUSED)      # told as such, not an outage
        self.assertEqual(self.server.requests, [])
        await bad.close()

    async def test_a_call_past_the_script_is_the_fakes_problem_not_a_traceback(self):
        """The fake answers a request it has no step for with a 500 and lists it; leaving it fails the test."""
        self.server.script(text("one"))
        self.assertEqual(await self.agent.turn("owner", "first", None), "one")
        self.assertEqual(await self.agent.turn("owner", "second", None), APOLOGY)
        self.assertEqual(self.server.problems, ["AssertionError: the model was called more often than scripted"] * 3)
        with self.assertRaisesRegex(AssertionError, "called more often than scripted"):
            self.server.check()
        self.server.problems.clear()


class BoundsTest(AgentTestCase):
    """SPEC §6.11: what one model response may ask for, and what of it the audit log and history keep."""

    def scripted(self, *replies: Reply) -> ScriptedLLM:
        self.model.script(*replies)
        return self.model

    def audit_size(self) -> int:
        return self.sql("SELECT pg_total_relation_size('audit_log')")[0][0]

    def events(self, event: str) -> list[tuple]:
        return self.sql("SELECT skill_name, decision, params, detail FROM audit_log WHERE event = %s ORDER BY id",
                        (event,))

    async def test_ten_thousand_calls_run_sixteen(self):
        model = self.scripted(ask(*(("echo_low", {"text": str(i)}) for i in range(10_000))), Reply("done", ()))
        started = time.monotonic()
        self.assertEqual(await self.agent.turn("owner", "flood", None), "done")
        self.assertLess(time.monotonic() - started, 10.0)      # ~1 s on an idle machine; 10,000 runs took 42 s
        tools = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
        self.assertEqual(len(tools), 10_000)
        self.assertEqual([t["tool_call_id"] for t in tools], [f"call_{i}" for i in range(10_000)])
        self.assertEqual([json.loads(t["content"]) for t in tools[:TOOL_CALLS_MAX]],
                         [{"success": True, "output": str(i)} for i in range(TOOL_CALLS_MAX)])
        refusal = json.dumps({"success": False, "error": "单次调用过多，未执行：echo_low"}, ensure_ascii=False)
        self.assertEqual({t["content"] for t in tools[TOOL_CALLS_MAX:]}, {refusal})
        self.assertEqual(len(self.events("skill_started")), TOOL_CALLS_MAX)
        [(_, decision, _, detail)] = self.events("skill_refused")
        self.assertEqual(decision, "too_many_calls")
        self.assertTrue(detail.startswith("9984 tool calls past the first 16"), detail)
        # The history keeps the refused calls' ids and names, not their arguments.
        [assistant] = [m for m in model.requests[1]["messages"] if m.get("tool_calls")]
        self.assertEqual(len(assistant["tool_calls"]), 10_000)
        self.assertEqual({c["function"]["arguments"] for c in assistant["tool_calls"][TOOL_CALLS_MAX:]}, {"{}"})
        self.assertEqual(assistant["tool_calls"][15]["function"]["arguments"], json.dumps({"text": "15"}))

    async def test_huge_arguments_reach_neither_the_audit_log_nor_later_requests(self):
        huge = "x" * (20 << 20)
        model = self.scripted(ask(("echo_low", {"text": huge}), ("mark_high", {"marker": huge})), Reply("ok", ()),
                              Reply("next", ()))
        before = self.audit_size()
        self.assertEqual(await self.agent.turn("owner", "big", self.owner.notify), "ok")
        self.assertEqual([json.loads(m["content"]) for m in model.requests[1]["messages"] if m["role"] == "tool"],
                         [{"success": False, "error": "参数过长：echo_low"},
                          {"success": False, "error": "参数过长：mark_high"}])
        self.assertEqual(self.owner.messages, [])           # no approval asked
        self.assertEqual(self.events("skill_started"), [])
        self.assertEqual([(name, decision) for name, decision, *_ in self.events("skill_refused")],
                         [("echo_low", "arguments_too_long"), ("mark_high", "arguments_too_long")])
        self.assertLess(self.audit_size() - before, 64 * 1024)
        self.assertEqual(await self.agent.turn("owner", "and now?", None), "next")
        for body in model.bodies[1:]:
            self.assertLess(len(body), 64 * 1024)
        [assistant] = [m for m in model.requests[2]["messages"] if m.get("tool_calls")]
        for call in assistant["tool_calls"]:
            self.assertEqual(json.loads(call["function"]["arguments"]),
                             {"_omitted": f"参数过长，未保存（{len(json.dumps({'text': huge}))} 字节）"}
                             if call["function"]["name"] == "echo_low" else
                             {"_omitted": f"参数过长，未保存（{len(json.dumps({'marker': huge}))} 字节）"})
        self.assertLess(self.sql("SELECT pg_total_relation_size('messages')")[0][0], 1 << 20)

    async def test_arguments_at_the_limit_are_validated_past_it_refused(self):
        pad = ARGUMENTS_MAX - len(json.dumps({"text": ""}))
        model = self.scripted(ask(("echo_low", json.dumps({"text": "y" * pad})),
                                  ("echo_low", json.dumps({"text": "y" * (pad + 1)}))), Reply("ok", ()))
        await self.agent.turn("owner", "edge", None)
        first, second = (json.loads(m["content"]) for m in model.requests[1]["messages"] if m["role"] == "tool")
        self.assertTrue(first["success"], first)
        self.assertEqual(second, {"success": False, "error": "参数过长：echo_low"})

    async def test_a_long_value_is_audited_as_prefix_and_hash_and_runs_whole(self):
        value = "日" * 1800 + "end"                         # 5,403 bytes of UTF-8
        model = self.scripted(ask(("echo_low", {"text": value})), Reply("ok", ()))
        await self.agent.turn("owner", "long", None)
        [tool] = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
        self.assertEqual(json.loads(tool["content"]), {"success": True, "output": value})   # the skill got it all
        [(_, _, params, _)] = self.events("skill_started")
        stored = params["text"]
        data = value.encode()
        tail = f"…[truncated, sha256={hashlib.sha256(data).hexdigest()}, {len(data)} bytes]"
        self.assertTrue(stored.endswith(tail), stored[-120:])
        self.assertTrue(value.startswith(stored[:-len(tail)]))
        self.assertGreater(len(stored[:-len(tail)]), 1200)
        self.assertLessEqual(len(stored.encode()), AUDIT_VALUE_MAX)

    async def test_run_command_refuses_long_arguments(self):
        out = await self.agent.turn("owner", '/run echo_low {"text": "' + "z" * ARGUMENTS_MAX + '"}', None)
        self.assertEqual(json.loads(out), {"success": False, "error": "参数过长：echo_low"})
        self.assertEqual(self.events("skill_started"), [])



class BoundsOverTheWireTest(WireTestCase):
    async def test_over_the_wire(self):
        """The real client: 20 calls in one response run 16; a 100 KiB argument is gone from the next request."""
        self.server.script(calls(*(("echo_low", {"text": str(i)}) for i in range(20)),
                                 ("echo_low", {"text": "w" * (100 << 10)})), text("ok"))
        self.assertEqual(await self.agent.turn("owner", "wire", None), "ok")
        contents = [json.loads(t["content"]) for t in self.tool_messages()]
        self.assertEqual(contents[:16], [{"success": True, "output": str(i)} for i in range(16)])
        self.assertEqual(contents[16:], [{"success": False, "error": "单次调用过多，未执行：echo_low"}] * 5)
        self.assertLess(len(self.server.raw[1]), 64 * 1024)


class ApprovalThroughConsoleTest(AgentTestCase):
    """A High call asked for and answered over the real console channel, via the router."""

    async def asyncSetUp(self):
        await super().asyncSetUp()
        read_fd, self.write_fd = os.pipe()
        self.stdin = os.fdopen(read_fd, "r")
        self.screen = Screen()
        self.console = ConsoleChannel("owner", stdin=self.stdin, stdout=self.screen, interactive=True)
        self.use(self.build(llm=self.llm, now=lambda: FIXED_NOW, channels=[self.console], primary=self.console))
        await self.console.start(self.router.deliver)

    async def asyncTearDown(self):
        os.close(self.write_fd)
        await self.console.stop()
        await asyncio.wait_for(self.console.closed.wait(), 5)     # the reader saw EOF
        self.stdin.close()
        await super().asyncTearDown()

    def type(self, line: str) -> None:
        os.write(self.write_fd, (line + "\n").encode())

    async def test_approved(self):
        """A full flow; the code is found only in the one message to the owner."""
        records = capture_logs(self)
        self.model.script(ask(("mark_high", {"marker": str(self.marker), "note": "ok"})), answer("已完成。"))
        self.type("请标记一下")
        await self.screen.wait_for("回复确认码以继续")
        code = self.screen.text.split("确认码：")[1][:6]
        self.type(code)
        await self.screen.wait_for("已完成。")
        self.assertEqual(self.screen.text.count(code), 1)
        self.assertFalse([r for r in records if code in r.getMessage()])
        audit = self.sql("SELECT string_agg(a::text, ' ') FROM audit_log a")[0][0]
        self.assertNotIn(code, audit)
        self.assertEqual(self.runs(), 1)
        self.assertEqual(json.loads(self.tool_messages()[0]["content"]), {"success": True, "note": "ok"})
        for body in self.model.bodies:
            self.assertNotIn(code, body)
        history = json.dumps(await self.store.recent_messages("owner", 50), ensure_ascii=False)
        self.assertNotIn(code, history)
        # A code typed when nothing is pending never reaches the model.
        requests = len(self.requests)
        self.type(code)
        await self.screen.wait_for(NOTHING_PENDING)
        self.assertEqual(len(self.requests), requests)

    async def test_rejected(self):
        self.model.script(ask(("mark_high", {"marker": str(self.marker)})), answer("好的，已取消。"))
        self.type("请标记一下")
        await self.screen.wait_for("回复确认码以继续")
        self.type("取消")
        await self.screen.wait_for("好的，已取消。")
        self.assertEqual(self.runs(), 0)
        self.assertEqual(self.tool_messages()[0]["content"],
                         json.dumps({"success": False, "error": "用户拒绝了你的调用：mark_high"}, ensure_ascii=False))


class Turns:
    """Helpers for turns timed against their deadline."""

    async def history(self) -> list[tuple[str, str | None]]:
        return [(m["role"], m.get("content")) for m in await self.store.recent_messages("owner", 50)]

    async def timed_turn(self, text: str, limit: float) -> str:
        started = time.monotonic()
        reply = await asyncio.wait_for(self.agent.turn("owner", text, self.owner.notify), 30)
        self.assertLess(time.monotonic() - started, limit)
        return reply


class DeadlineTest(Turns, WireTestCase):
    """SPEC §15 "Deadlines": a stalled or dripping model costs the owner one line within the deadline."""

    async def test_a_stalled_model_ends_the_turn_at_its_deadline_and_the_next_message_is_answered(self):
        self.agent.turn_timeout = 0.5       # the model request's own deadline (60 s) never comes
        self.server.script(stall(), text("这次好了。"))
        self.assertEqual(await self.timed_turn("在吗", 0.5 + 2.0), TURN_TIMEOUT_REPLY)
        self.agent.turn_timeout = 30
        self.assertEqual(await self.timed_turn("现在呢", 5.0), "这次好了。")
        self.assertEqual(await self.history(), [("user", "在吗"), ("assistant", TURN_TIMEOUT_REPLY),
                                                ("user", "现在呢"), ("assistant", "这次好了。")])

    async def test_a_dripping_model_gets_its_request_deadline_then_one_apology(self):
        self.llm.timeout = 0.3              # IAS_LLM_TIMEOUT, small; each read succeeds within 50 ms
        self.server.script(drip(0.05), drip(0.05), drip(0.05), text("好了。"))
        self.assertEqual(await self.timed_turn("在吗", 3 * 0.3 + 2.0), APOLOGY)
        self.assertEqual(len(self.server.requests), 3)
        self.assertEqual(await self.timed_turn("现在呢", 5.0), "好了。")

    async def test_broken_json_then_a_good_reply_is_answered(self):
        self.server.script(broken(), text("收到。"))
        self.assertEqual(await self.agent.turn("owner", "你好", None), "收到。")
        self.assertEqual(len(self.server.requests), 2)

    async def test_the_message_is_stored_whatever_the_model_did(self):
        for steps, reply in [((error(500), error(502), error(503)), APOLOGY),
                             ((broken(), broken(), broken()), APOLOGY)]:
            with self.subTest(reply=reply, steps=steps[0]):
                await self.store.clear_messages("owner")
                self.server.script(*steps)
                self.assertEqual(await self.agent.turn("owner", "记住这句话", None), reply)
                self.assertEqual(await self.history(), [("user", "记住这句话"), ("assistant", reply)])

    async def test_the_clock_runs_again_after_the_approval(self):
        self.agent.turn_timeout = 3.0
        self.server.script(calls(("mark_high", {"marker": str(self.marker)})), stall())
        turn = asyncio.create_task(self.agent.turn("owner", "请标记", self.owner.notify))
        await self.approvals.redeem("owner", await self.owner.code())
        self.assertEqual(await asyncio.wait_for(turn, 10), TURN_TIMEOUT_REPLY)
        self.assertEqual(self.runs(), 1)


class ToolDeadlineTest(Turns, AgentTestCase):
    """The turn's deadline around skill calls and approvals."""

    async def test_a_deadline_during_a_tool_call_leaves_a_valid_history(self):
        """The turn ends while a skill runs: the call is answered as interrupted, so the next request is a
        conversation the API accepts (every call has its result)."""
        self.agent.turn_timeout = 1.0
        pidfile = self.tmp / "sleepy.pid"
        self.model.script(ask(("sleepy", {"pidfile": str(pidfile)})), answer("继续。"))
        self.assertEqual(await self.timed_turn("睡一会", 1.0 + 5.0), TURN_TIMEOUT_REPLY)
        self.agent.turn_timeout = 30
        self.assertEqual(await self.agent.turn("owner", "然后呢", None), "继续。")
        messages = self.requests[1]["messages"]
        self.assertEqual([m["role"] for m in messages], ["system", "user", "assistant", "tool", "assistant", "user"])
        self.assertEqual(messages[3]["tool_call_id"], messages[2]["tool_calls"][0]["id"])
        self.assertEqual(json.loads(messages[3]["content"]), {"success": False, "error": "技能执行被中断：sleepy"})
        self.assertEqual(messages[4]["content"], TURN_TIMEOUT_REPLY)

    async def test_the_wait_for_the_owners_code_is_not_counted(self):
        self.agent.turn_timeout = 1.5
        self.model.script(ask(("mark_high", {"marker": str(self.marker)})), answer("标好了。"))
        turn = asyncio.create_task(self.agent.turn("owner", "请标记", self.owner.notify))
        code = await self.owner.code()
        await asyncio.sleep(2.0)            # the owner takes longer than the whole turn may
        self.assertFalse(turn.done())
        self.assertEqual(await self.approvals.redeem("owner", code), "已确认，正在执行：mark_high")
        self.assertEqual(await asyncio.wait_for(turn, 10), "标好了。")
        self.assertEqual(self.runs(), 1)


class CommandBehindAStallTest(WireTestCase):
    """/help behind a stalled model, through the router: it waits at most the turn's deadline."""

    async def test_help_waits_at_most_the_deadline(self):
        channel = FakeChannel("wechat")
        self.use(self.build(llm=self.llm, now=lambda: FIXED_NOW, channels=[channel], primary=channel))
        self.agent.turn_timeout = 0.5
        self.server.script(stall())
        started = time.monotonic()
        first = asyncio.create_task(self.router.deliver(Inbound("wechat", "owner", "在吗")))
        second = asyncio.create_task(self.router.deliver(Inbound("wechat", "owner", "/help")))
        await channel.wait_for(HELP)
        self.assertLess(time.monotonic() - started, 0.5 + 2.0)
        self.assertEqual(channel.sent, [("owner", TURN_TIMEOUT_REPLY), ("owner", HELP)])
        await asyncio.gather(first, second)
        self.assertEqual(self.router.users_in_turn, 0)          # the user's lock is free


RECORDED = json.loads((FIXTURES / "model_replies" / "local_models.json").read_text(encoding="utf-8"))


class RealModelHabitsTest(WireTestCase):
    """SPEC §15 "Real models' habits", with recorded replies of llama.cpp, Ollama and vLLM."""

    async def asyncSetUp(self):
        self.qw = QWeatherServer().start()
        await super().asyncSetUp()

    async def asyncTearDown(self):
        await super().asyncTearDown()
        await asyncio.to_thread(self.qw.close)

    def runner_environ(self) -> dict[str, str]:
        return {**super().runner_environ(), "QWEATHER_API_HOST": self.qw.base_url, "QWEATHER_API_KEY": KEY}

    async def test_a_call_written_as_text_runs(self):
        for name, body in RECORDED["calls"].items():
            with self.subTest(name):
                before = len(self.server.requests)
                self.server.script(raw(body), text("北京现在晴。"))
                self.assertEqual(await self.agent.turn("owner", "北京天气怎么样", None), "北京现在晴。")
                [tool] = self.tool_messages()
                result = json.loads(tool["content"])
                self.assertTrue(result["success"], result)
                self.assertIn("北京", json.dumps(result, ensure_ascii=False))
                assistant = self.server.requests[before + 1]["messages"][-2]
                self.assertEqual(assistant["tool_calls"][0]["id"], tool["tool_call_id"])
                self.assertEqual(assistant["tool_calls"][0]["function"]["name"], "query_weather")
                await self.store.clear_messages("owner")
        self.assertEqual(len([r for r in self.qw.requests if r.path == "/v7/weather/now"]), len(RECORDED["calls"]))

    async def test_other_shapes_stay_text(self):
        for name, body in RECORDED["texts"].items():
            with self.subTest(name):
                self.server.script(raw(body))
                self.assertEqual(await self.agent.turn("owner", "北京天气怎么样", None),
                                 body["choices"][0]["message"]["content"])
        self.assertEqual(self.qw.requests, [])

    async def test_a_high_call_written_as_text_still_needs_the_code(self):
        content = '<tool_call>\n{"name": "mark_high", "arguments": {"marker": %s}}\n</tool_call>' % json.dumps(
            str(self.marker))
        self.server.script(text(content), text("已取消。"))
        turn = asyncio.create_task(self.agent.turn("owner", "请标记", self.owner.notify))
        await asyncio.wait_for(self.owner.arrived.wait(), 10)
        self.assertRegex(self.owner.messages[-1], CODE_LINE)
        self.assertIn("mark_high", self.owner.messages[-1])
        self.assertEqual(await self.approvals.redeem("owner", "取消"), "已取消：mark_high")
        self.assertEqual(await asyncio.wait_for(turn, 10), "已取消。")
        self.assertEqual(self.runs(), 0)

    async def test_an_empty_answer_after_a_tool_error_is_its_gist(self):
        """Qwen2.5-1.5B on llama.cpp: a call for an unknown city, then empty content."""
        self.server.script(*(raw(body) for body in RECORDED["after_error"].values()))
        reply = await self.agent.turn("owner", "火星天气怎么样", None)
        [tool] = self.tool_messages()
        error = json.loads(tool["content"])["error"]
        self.assertEqual(reply, error)
        self.assertIn("火星", reply)
        history = await self.store.recent_messages("owner", 10)
        self.assertEqual(history[-1], {"role": "assistant", "content": error})

    async def test_an_empty_answer_without_a_tool_result_says_so(self):
        for empty in ("", "  \n", None):
            with self.subTest(empty=empty):
                self.server.script({"content": empty})
                self.assertEqual(await self.agent.turn("owner", "嗯", None), NO_ANSWER)
        self.server.script(calls(("get_current_datetime", {"format": "date"})), text(""))
        self.assertEqual(await self.agent.turn("owner", "今天几号", None), NO_ANSWER)   # no output or error to show


if __name__ == "__main__":
    unittest.main()

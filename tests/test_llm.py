"""The model endpoint on the wire: total deadlines, replies that are not completions, calls written as text."""
import asyncio
import importlib
import json
import socket
import subprocess
import sys
import time
import unittest

from ias.llm import LLM, KeyRefused, LLMError, Reply, ToolCall, text_calls
from tests.servers.llm import LLMServer, broken, drip, error, raw, stall, text
from tests.support import FIXTURES, REPO

RECORDED = json.loads((FIXTURES / "model_replies" / "local_models.json").read_text(encoding="utf-8"))
WEATHER = {"type": "function", "function": {"name": "query_weather", "description": "实时天气",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
ECHO = {"type": "function", "function": {"name": "echo_low", "description": "echo", "parameters": {"type": "object"}}}


def said(reply: Reply) -> tuple:
    """What a reply says (its text and calls), apart from who answered and its tokens."""
    return reply.content, reply.tool_calls


class WireTestCase(unittest.IsolatedAsyncioTestCase):
    timeout = 0.4                   # IAS_LLM_TIMEOUT, small

    @classmethod
    def setUpClass(cls):
        importlib.import_module("openai")       # the first request's import is not part of any timed attempt

    async def asyncSetUp(self):
        self.server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01,), timeout=self.timeout)

    async def asyncTearDown(self):
        await self.llm.close()
        await asyncio.to_thread(self.server.__exit__)

    async def complete(self, tools=(WEATHER,), limit: float = 10) -> Reply:
        """One request; `limit` only keeps a hung client from hanging the suite."""
        return await asyncio.wait_for(self.llm.complete([{"role": "user", "content": "北京天气怎么样"}], list(tools)),
                                      limit)


# A fresh interpreter: which thread imports `openai`, and what the debug loop reports as slow (over 0.5 s).
FIRST_REQUEST = """
import asyncio, json, logging, sys, threading
from ias.llm import LLM
from tests.servers.llm import LLMServer, text

importers = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "openai":
            importers.append(threading.current_thread().name)
sys.meta_path.insert(0, Watch())
slow = []
handler = logging.Handler()
handler.emit = lambda record: slow.append(record.getMessage()[:60]) if "took" in record.getMessage() else None
logging.getLogger("asyncio").addHandler(handler)

async def main():
    asyncio.get_running_loop().slow_callback_duration = 0.5
    with LLMServer([text("ok")]) as server:
        llm = LLM("sk-test", server.base_url, "test-model")
        reply = await llm.complete([{"role": "user", "content": "hi"}], [])
        await llm.close()
    return reply.content

print(json.dumps({"reply": asyncio.run(main(), debug=True), "importers": importers, "slow": slow}))
"""


class FirstRequestTest(unittest.TestCase):
    def test_openai_is_imported_off_the_event_loop(self):
        """The first request imports the SDK (a second or more) in a worker thread: the loop is never held."""
        done = subprocess.run([sys.executable, "-c", FIRST_REQUEST], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        found = json.loads(done.stdout)
        self.assertEqual(found["reply"], "ok")
        self.assertTrue(found["importers"], found)
        self.assertNotIn("MainThread", found["importers"])
        self.assertEqual(found["slow"], [])


class FakeTest(unittest.TestCase):
    """The fake endpoint keeps its own troubles instead of printing tracebacks into a green run."""

    def test_a_client_hanging_up_mid_request_is_counted_not_a_problem(self):
        """A daemon stopped during a turn cuts its request short (five tracebacks in a green run before)."""
        with LLMServer() as server:
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                             b"Content-Length: 100\r\n\r\n{\"model\":")
                sock.shutdown(socket.SHUT_WR)
                self.assertEqual(sock.recv(100), b"")           # no answer: the connection is closed
            self.assertEqual((server.hangups, server.problems, server.requests), (1, [], []))

    def test_a_request_past_the_script_is_a_500_and_fails_the_test_using_it(self):
        with self.assertRaisesRegex(AssertionError, "called more often than scripted"):
            with LLMServer() as server:
                async def request():
                    llm = LLM("sk-test", server.base_url, "test-model", retry_delays=())
                    try:
                        await llm.complete([], [])
                    finally:
                        await llm.close()
                with self.assertRaisesRegex(LLMError, "InternalServerError"):
                    asyncio.run(request())
        self.assertEqual(server.problems, ["AssertionError: the model was called more often than scripted"])


class DeadlineTest(WireTestCase):
    async def assert_fails_within_deadline(self, step: dict) -> None:
        self.server.script(step, step, text("又好了。"))
        started = time.monotonic()
        with self.assertRaises(LLMError):
            await self.complete()
        elapsed = time.monotonic() - started
        self.assertGreaterEqual(elapsed, 2 * self.timeout)          # both attempts waited out their deadline
        self.assertLess(elapsed, 2 * self.timeout + 2.0)
        self.assertEqual(len(self.server.requests), 2)
        self.assertEqual((await self.complete()).content, "又好了。")     # the next request is answered

    async def test_a_stalled_endpoint(self):
        """It accepts the request and never answers."""
        await self.assert_fails_within_deadline(stall())

    async def test_a_dripping_endpoint(self):
        """A byte every 50 ms: each read is well within any per-read timeout, the reply never complete."""
        await self.assert_fails_within_deadline(drip(0.05))

    async def test_the_deadline_is_per_attempt(self):
        """A stalled first attempt, then a good one: the reply."""
        self.server.script(stall(), text("好了。"))
        self.assertEqual((await self.complete()).content, "好了。")


class RefusedKeyTest(WireTestCase):
    async def test_401_and_403_are_key_refused_without_a_retry(self):
        wrong = LLM("sk-wrong", self.server.base_url, "test-model", retry_delays=(0.01, 0.01))
        self.addAsyncCleanup(wrong.close)
        with self.assertRaises(KeyRefused):
            await wrong.complete([{"role": "user", "content": "hi"}], [])
        self.server.script(error(403))
        with self.assertRaises(KeyRefused):
            await self.complete()
        self.assertEqual(len(self.server.requests), 1)      # the 401 is refused before the fake counts it
        with self.assertRaises(KeyRefused):
            await wrong.models()

    async def test_models_lists_the_endpoint_s_names_or_none_without_a_list(self):
        self.assertEqual(await self.llm.models(), ["test-model"])
        with LLMServer(models=None) as bare:
            elsewhere = LLM("sk-test", bare.base_url, "test-model")
            self.addAsyncCleanup(elsewhere.close)
            self.assertIsNone(await elsewhere.models())


class NotACompletionTest(WireTestCase):
    async def test_broken_json_is_retried_like_a_5xx(self):
        for bad in (broken(), raw(b"<html><body>502 Bad Gateway</body></html>"), raw({}), raw({"choices": []})):
            with self.subTest(bad=bad["raw"][:40]):
                self.server.script(bad, text("好的。"))
                self.assertEqual(said(await self.complete()), ("好的。", ()))

    async def test_broken_json_every_time_is_an_llm_error(self):
        self.server.script(broken(), broken())
        with self.assertRaisesRegex(LLMError, "failed 2 times: a reply that is not valid JSON"):
            await self.complete()


class TextCallsOnTheWireTest(WireTestCase):
    """Recorded replies of llama.cpp, Ollama and vLLM (tests/fixtures/model_replies)."""

    async def test_each_recorded_shape_is_a_call(self):
        for name, body in RECORDED["calls"].items():
            with self.subTest(name):
                self.server.script(raw(body))
                reply = await self.complete(tools=(ECHO, WEATHER))
                self.assertIsNone(reply.content)
                [call] = reply.tool_calls
                self.assertEqual((call.name, json.loads(call.arguments)), ("query_weather", {"city": "北京"}))
                self.assertTrue(call.id.startswith("call_text_"), call.id)

    async def test_other_shapes_stay_text(self):
        for name, body in RECORDED["texts"].items():
            with self.subTest(name):
                self.server.script(raw(body))
                self.assertEqual(said(await self.complete()), (body["choices"][0]["message"]["content"], ()))

    async def test_a_tool_that_was_not_offered_stays_text(self):
        body = RECORDED["calls"]["tools_tag (llama.cpp, Qwen2.5-1.5B)"]
        self.server.script(raw(body))
        self.assertEqual(said(await self.complete(tools=(ECHO,))), (body["choices"][0]["message"]["content"], ()))


class TextCallsTest(unittest.TestCase):
    offered = {"query_weather", "echo_low"}

    def calls(self, content: str) -> list[tuple[str, dict]]:
        return [(c.name, json.loads(c.arguments)) for c in text_calls(content, self.offered)]

    def test_several_tagged_calls(self):
        content = ('<tool_call>\n{"name": "query_weather", "arguments": {"city": "北京"}}\n</tool_call>\n'
                   '<tool_call>\n{"name": "echo_low", "arguments": {"text": "a"}}\n</tool_call>')
        self.assertEqual(self.calls(content), [("query_weather", {"city": "北京"}), ("echo_low", {"text": "a"})])
        ids = [c.id for c in text_calls(content, self.offered)]
        self.assertEqual(len(set(ids)), 2)
        # One unknown among them: all text.
        self.assertEqual(self.calls(content.replace("echo_low", "rm_rf")), [])

    def test_a_list_of_calls_and_the_function_tag_with_escaped_quotes(self):
        self.assertEqual(self.calls('[{"name": "echo_low", "arguments": {}}]'), [("echo_low", {})])
        self.assertEqual(self.calls('<function name="echo_low" arguments="{&quot;text&quot;: &quot;x&quot;}"></function>'),
                         [("echo_low", {"text": "x"})])
        self.assertEqual(self.calls("<function name=echo_low arguments='{\"text\": \"a&amp;b\"}'/>"),
                         [("echo_low", {"text": "a&amp;b"})])      # single quotes: the JSON as written

    def test_not_calls(self):
        for content in ["", "   ", "北京今天晴。", '{"name": "echo_low", "arguments": "not json"}',
                        '{"name": "echo_low", "arguments": "[1]"}', '{"name": 5, "arguments": {}}', "[]", "[1]",
                        '<tool_call>{"name": "echo_low", "arguments": {}}</tool_call> 好的',
                        '<tools>{"name": "echo_low", "arguments": {}}</tool_call>',
                        "<function name=echo_low arguments='[1]'/>", "<function name=echo_low/>",
                        '```\n{"name": "echo_low", "arguments": {}}', '{"name": "echo_low", "arguments": {}} {}',
                        "[" * 10_000 + "]" * 10_000]:
            with self.subTest(content=content[:60]):
                self.assertEqual(text_calls(content, self.offered), ())

    def test_hostile_sizes_are_quick(self):
        started = time.monotonic()
        for content in ["<tool_call>" * 100_000, "<tools>" + " " * 1_000_000, "<function name=a " * 50_000,
                        '{"name": "echo_low", "arguments": {"text": "' + "x" * 2_000_000 + '"}}']:
            text_calls(content, self.offered)
        self.assertLess(time.monotonic() - started, 2.0)

    def test_a_text_call_becomes_an_assistant_message_with_the_call(self):
        [call] = text_calls('<tools>{"name": "echo_low", "arguments": {"text": "hi"}}</tools>', self.offered)
        message = Reply(None, (call,)).message()
        self.assertEqual(message["tool_calls"], [{"id": call.id, "type": "function",
                                                  "function": {"name": "echo_low", "arguments": '{"text": "hi"}'}}])
        self.assertIsInstance(call, ToolCall)


if __name__ == "__main__":
    unittest.main()

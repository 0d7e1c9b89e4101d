"""The shared test support itself: what the debug loop's reports keep, and the in-process model."""
import asyncio
import time
import unittest

from ias.llm import LLMError
from tests.support import SLOW_CALLBACK, ScriptedLLM, answer, ask, capture_logs


class DebugLoopNoiseTest(unittest.IsolatedAsyncioTestCase):
    """A green run prints no "took N seconds" line for a test's own blocking, but still for a daemon task that
    holds the loop (the first request's openai import did, 1-3 s)."""

    async def test_only_a_daemon_task_holding_the_loop_is_reported(self):
        records = capture_logs(self)

        async def turn(seconds: float) -> None:     # a daemon task's step blocking the loop
            time.sleep(seconds)

        time.sleep(0.15)                            # this test's own step: not reported
        await asyncio.create_task(turn(0.15))       # under SLOW_CALLBACK: not reported
        await asyncio.create_task(turn(SLOW_CALLBACK + 0.1))
        shown = [r.getMessage() for r in records if r.name == "asyncio" and "took" in r.msg]   # past the filter
        self.assertEqual(len(shown), 1, [line[:120] for line in shown])
        self.assertIn("coro=<DebugLoopNoiseTest.test_only_a_daemon_task_holding_the_loop_is_reported.<locals>.turn()",
                      shown[0])


class ScriptedLLMTest(unittest.IsolatedAsyncioTestCase):
    async def test_replies_requests_and_completeness(self):
        model = ScriptedLLM(ask(("echo_low", {"text": "a"})), LLMError("down"), answer("done"))
        messages = [{"role": "user", "content": "hi"}]
        reply = await model.complete(messages, [])
        self.assertEqual((reply.content, reply.tool_calls[0].name, reply.tool_calls[0].arguments),
                         (None, "echo_low", '{"text": "a"}'))
        messages.append({"role": "assistant", "content": "later"})       # the request kept is what was sent
        with self.assertRaises(LLMError):
            await model.complete(messages, [])
        self.assertEqual(model.requests[0]["messages"], [{"role": "user", "content": "hi"}])
        with self.assertRaisesRegex(AssertionError, "1 scripted model replies were never requested"):
            model.assert_complete()
        self.assertEqual((await model.complete([], [])).content, "done")
        model.assert_complete()
        with self.assertRaisesRegex(AssertionError, "more often than scripted"):
            await model.complete([], [])
        with self.assertRaisesRegex(AssertionError, "more often than scripted"):
            model.assert_complete()


if __name__ == "__main__":
    unittest.main()


class QuietServerTest(unittest.TestCase):
    """A client that resets a kept-alive connection to a local fake server prints nothing into the run."""

    def test_a_reset_between_requests_is_not_a_traceback(self):
        import contextlib
        import io
        import socket
        import struct
        from tests.servers.llm import LLMServer
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed), LLMServer() as server:
            client = socket.create_connection(("127.0.0.1", server.port))
            client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n\r\n")
            self.assertIn(b"200 OK", client.recv(65536))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))     # close: RST
            client.close()
            time.sleep(0.2)         # the server's thread meets the reset (nothing to wait on from here)
        self.assertEqual(printed.getvalue(), "")

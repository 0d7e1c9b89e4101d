"""The console channel reads stdin as the owner's chat: invalid UTF-8 costs a character, never the console;
on a terminal it shows a hint and a prompt, and /exit or Ctrl-D ask the daemon to stop."""
import asyncio
import io
import os
import pty
import unittest

from ias.channels.console import HINT, PROMPT, ConsoleChannel


class ConsoleInputTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.received: list[str] = []
        self.arrived = asyncio.Event()

    async def deliver(self, message) -> None:
        self.received.append(message.text)
        self.arrived.set()

    async def wait_for(self, count: int) -> None:
        async def loop():
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(loop(), 10)

    async def test_invalid_utf8_on_a_pipe(self):
        """As sys.stdin: a text stream over a pipe. Bad bytes become U+FFFD; later lines still arrive."""
        read_fd, write_fd = os.pipe()
        stdin = os.fdopen(read_fd, "r", encoding="utf-8")       # strict, as a UTF-8 locale's stdin is
        self.addCleanup(stdin.close)
        console = ConsoleChannel("owner", stdin=stdin, stdout=io.StringIO())
        await console.start(self.deliver)
        os.write(write_fd, b"caf\xe9\n\xff\xfe\n")
        await self.wait_for(2)
        os.write(write_fd, "你好 ".encode() + b"\xe4\xbd\n/help\n")          # a cut character
        await self.wait_for(4)
        os.close(write_fd)
        await asyncio.wait_for(console.closed.wait(), 10)
        self.assertEqual(self.received, ["caf\ufffd", "\ufffd\ufffd", "你好 \ufffd", "/help"])

    async def test_utf8_text_is_unchanged(self):
        read_fd, write_fd = os.pipe()
        stdin = os.fdopen(read_fd, "r")
        self.addCleanup(stdin.close)
        console = ConsoleChannel("owner", stdin=stdin, stdout=io.StringIO())
        await console.start(self.deliver)
        os.write(write_fd, "你好\r\n\n  \nok 😀\n".encode())
        os.close(write_fd)
        await asyncio.wait_for(console.closed.wait(), 10)
        self.assertEqual(self.received, ["你好", "ok 😀"])

    async def test_a_text_stream_without_bytes(self):
        console = ConsoleChannel("owner", stdin=io.StringIO("one\ntwo\n"), stdout=io.StringIO())
        await console.start(self.deliver)
        await asyncio.wait_for(console.closed.wait(), 10)
        self.assertEqual(self.received, ["one", "two"])

    async def test_a_failing_stdin_closes_the_console(self):
        class Gone(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, buffer):
                raise OSError(5, "Input/output error")          # e.g. the terminal hung up

        console = ConsoleChannel("owner", stdin=io.TextIOWrapper(io.BufferedReader(Gone())), stdout=io.StringIO())
        await console.start(self.deliver)
        await asyncio.wait_for(console.closed.wait(), 10)
        self.assertEqual(self.received, [])



class ConsoleEndTest(unittest.IsolatedAsyncioTestCase):
    """`ended`: the owner asked to stop (/exit anywhere, Ctrl-D on a terminal), not a pipe that ran dry."""

    async def asyncSetUp(self):
        self.received: list[str] = []

    async def deliver(self, message) -> None:
        self.received.append(message.text)

    def terminal(self):
        """A pty: stdin (a terminal) for the console, and the keyboard's end of it."""
        keyboard, tty = pty.openpty()
        stdin = os.fdopen(tty, "r", encoding="utf-8")
        self.addCleanup(stdin.close)
        self.addCleanup(os.close, keyboard)
        return stdin, keyboard

    async def test_exit_ends_the_console_and_is_not_delivered(self):
        for command in ("/exit", "  /quit "):
            read_fd, write_fd = os.pipe()
            stdin = os.fdopen(read_fd, "r")
            self.addCleanup(stdin.close)
            console = ConsoleChannel("owner", stdin=stdin, stdout=io.StringIO(), prompt=True)
            await console.start(self.deliver)
            os.write(write_fd, f"hi\n{command}\nnot read\n".encode())
            await asyncio.wait_for(console.ended.wait(), 10)
            os.close(write_fd)
            await asyncio.sleep(0)
            self.assertEqual(self.received[-1], "hi")
            self.assertNotIn("not read", self.received)

    async def test_the_end_of_a_pipe_is_not_a_request_to_stop(self):
        console = ConsoleChannel("owner", stdin=io.StringIO("one\n"), stdout=io.StringIO(), prompt=True)
        await console.start(self.deliver)
        await asyncio.wait_for(console.closed.wait(), 10)
        await asyncio.sleep(0)
        self.assertFalse(console.ended.is_set())        # under systemd stdin is /dev/null: the daemon runs on

    async def test_ctrl_d_on_a_terminal_ends_the_console(self):
        stdin, keyboard = self.terminal()
        out = io.StringIO()
        console = ConsoleChannel("owner", stdin=stdin, stdout=out, prompt=True)
        await console.start(self.deliver)
        os.write(keyboard, "你好\n\x04".encode())          # a line, then Ctrl-D at the start of the next
        await asyncio.wait_for(console.ended.wait(), 10)
        self.assertEqual(self.received, ["你好"])
        self.assertEqual(out.getvalue(), f"{HINT}\n{PROMPT}")

    async def test_a_hint_at_start_and_a_prompt_after_each_reply_on_a_terminal_only(self):
        stdin, keyboard = self.terminal()
        out = io.StringIO()
        console = ConsoleChannel("owner", stdin=stdin, stdout=out, prompt=True)
        await console.start(self.deliver)
        await console.post("owner", "回答\n", "c1")
        self.assertEqual(out.getvalue(), f"{HINT}\n{PROMPT}回答\n{PROMPT}")
        for prompt, stdin in ((True, io.StringIO("")), (False, stdin)):     # a pipe; the approvals' console
            plain = io.StringIO()
            console = ConsoleChannel("owner", stdin=stdin, stdout=plain, prompt=prompt)
            await console.start(self.deliver)
            await console.post("owner", "回答", "c2")
            self.assertEqual(plain.getvalue(), "回答\n")


if __name__ == "__main__":
    unittest.main()

"""The console channel reads stdin as the owner's chat: invalid UTF-8 costs a character, never the console."""
import asyncio
import io
import os
import unittest

from ias.channels.console import ConsoleChannel


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


if __name__ == "__main__":
    unittest.main()

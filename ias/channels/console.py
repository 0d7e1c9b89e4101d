"""The console channel: the terminal is the owner's chat (development, `ias run`, `--once`).

stdin is read by a daemon thread, because asyncio's pipe reader would switch the terminal to
non-blocking mode, which stdout shares; the thread hands each line to the event loop. Lines are
read as bytes and decoded as UTF-8 with replacement characters, so invalid input (a stray
byte, a cut multi-byte character) costs a character, never the console.

It has no window and no budget (the `Channel` defaults): everything is printed at once. As the daemon's
console (`prompt=True`) on a terminal it shows a one-line hint at start and a prompt after each reply.
`/exit` (anywhere) and the end of input on a terminal (Ctrl-D) set `ended`: the daemon stops. The end
of a pipe does not (under systemd stdin is /dev/null). A file is shown as its caption and its path
(`[文件] /abs/path`, the outgoing copy). Not handled: several users, line editing,
anything printed before a restart (not `resumable`).
"""
from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import TextIO

from .base import FAILED, SENT, Channel, Deliver, Inbound

HINT = "输入消息与 iAs 对话；/help 查看命令，/exit 退出。"
PROMPT = "> "
EXIT_COMMANDS = ("/exit", "/quit")
FILE_LINE = "[文件] {path}"


class ConsoleChannel(Channel):
    """One user (the owner) typing lines on stdin and reading replies on stdout."""

    name = "console"

    def __init__(self, user_id: str, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 interactive: bool | None = None, prompt: bool = False):
        self.user_id = user_id
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self._interactive = interactive
        self._prompt = prompt               # the daemon's console: a hint at start, a prompt after each reply
        self.started = False
        self.closed = asyncio.Event()        # set when stdin reaches EOF (or /exit)
        self.ended = asyncio.Event()         # set by /exit, or EOF on a terminal: the owner asked to stop
        self._thread: threading.Thread | None = None

    def interactive(self) -> bool:
        """True when a person can answer: stdin is a terminal (unless told otherwise)."""
        if self._interactive is not None:
            return self._interactive
        try:
            return self.stdin.isatty()
        except (AttributeError, ValueError):
            return False

    def can_confirm(self) -> bool:
        # Without a terminal (e.g. under systemd) stdout is a log: a code must never go there.
        return self.interactive()

    async def start(self, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        self.started = True
        terminal = self.interactive()
        if self._prompt and terminal:
            self._write(f"{HINT}\n{PROMPT}")

        def tell(callback, *args) -> None:
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:                 # the loop is closed (the daemon ended first): nobody to tell
                pass

        def pump() -> None:
            asked = terminal        # Ctrl-D on a terminal is a request to stop; the end of a pipe is not
            try:
                for line in _lines(self.stdin):
                    text = line.rstrip("\r\n")
                    if text.strip() in EXIT_COMMANDS:
                        asked = True
                        break
                    if text.strip():
                        asyncio.run_coroutine_threadsafe(deliver(Inbound(self.name, self.user_id, text)), loop)
                    elif self._prompt and terminal:
                        tell(self._write, PROMPT)
            except (OSError, ValueError):        # the terminal went away, or stdin was closed under us
                pass
            except RuntimeError:                 # the loop closed while lines were still coming
                return
            tell(self.closed.set)
            if asked:
                tell(self.ended.set)

        self._thread = threading.Thread(target=pump, name="console-stdin", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self.closed.set()

    async def post(self, user_id: str, text: str, client_id: str) -> str:
        prompt = PROMPT if self._prompt and self.interactive() else ""
        return SENT if self._write(text.rstrip("\n") + "\n" + prompt) else FAILED

    async def send_file(self, user_id: str, path: Path, caption: str | None, client_id: str) -> str:
        """The caption, then the file's absolute path (the copy is kept a while: `outgoing.sweep`)."""
        if caption and await self.post(user_id, caption, client_id) != SENT:
            return FAILED
        return await self.post(user_id, FILE_LINE.format(path=path.absolute()), client_id)

    def _write(self, text: str) -> bool:
        try:
            self.stdout.write(text)
            self.stdout.flush()
        except (OSError, ValueError):
            return False
        return True


def _lines(stream: TextIO):
    """The stream's lines as text; from its byte buffer when it has one, decoded leniently."""
    raw = getattr(stream, "buffer", None)
    if raw is None:                      # already text (e.g. io.StringIO)
        yield from stream
        return
    for line in raw:
        yield line.decode("utf-8", "replace")

"""One MCP session over a server process's stdio: JSON-RPC 2.0 lines, the handshake, listing and calls.

See the package docstring for the protocol iAs speaks and what it does not handle.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine

from ..limits import (
    MCP_LINE_MAX,
    MCP_LIST_BYTES_MAX,
    MCP_PAGES_MAX,
    MCP_PROTOCOL_TIMEOUT,
    MCP_STDERR_LINE,
    MCP_STDERR_LINES,
    MCP_TOOLS_MAX,
)
from ..runner import Server
from ..skills import Skill
from ..supervisor import Scope

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")     # newest first; the first is offered
CLIENT_INFO = {"name": "ias", "version": "1"}


class McpError(Exception):
    """The server could not be started, broke the protocol, answered with an error, or went away."""


class Connection:
    """One running server and the JSON-RPC session over its pipes."""

    def __init__(self, server: Server, tasks: Scope, on_notify: Callable[[str], None] | None = None):
        """`tasks`: the supervisor's group its reader, stderr logger and background work run in."""
        self.server = server
        self.name = server.name
        self.protocol = ""
        self.info: dict = {}
        self._on_notify = on_notify
        self._next = 0
        self._pending: dict[int, asyncio.Future] = {}
        self.closed = asyncio.Event()
        self.started = time.monotonic()
        self._tasks = tasks
        self._readers = (tasks.spawn(self._read(), f"mcp {self.name} reader"),
                         tasks.spawn(self._stderr(), f"mcp {self.name} stderr"))
        self._junk = 0                       # lines that were no JSON-RPC message (logged up to MCP_STDERR_LINES)

    def background(self, coro: Coroutine) -> None:
        """A task that must not hold up the reader, in the supervisor's group."""
        self._tasks.spawn(coro, f"mcp {self.name} background")

    async def initialize(self, timeout: float = MCP_PROTOCOL_TIMEOUT) -> None:
        """The handshake; raises McpError when the server answers a revision iAs does not speak."""
        result = await self.request("initialize", {"protocolVersion": PROTOCOL_VERSIONS[0], "capabilities": {},
                                                   "clientInfo": CLIENT_INFO}, timeout)
        version = result.get("protocolVersion")
        if version not in PROTOCOL_VERSIONS:
            raise McpError(f"mcp server {self.name} speaks protocol revision {str(version)[:40]!r}; "
                           f"iAs speaks {', '.join(PROTOCOL_VERSIONS)}")
        self.protocol = version
        self.info = result.get("serverInfo") if isinstance(result.get("serverInfo"), dict) else {}
        await self.notify("notifications/initialized")

    async def list_tools(self, timeout: float = MCP_PROTOCOL_TIMEOUT) -> list[dict]:
        """Every tool, page by page (at most MCP_PAGES_MAX pages, MCP_TOOLS_MAX tools, and no page asked for
        once MCP_LIST_BYTES_MAX bytes came: what a listing costs to digest and cache grows with its size)."""
        tools: list[dict] = []
        cursor = None
        size = 0
        for _ in range(MCP_PAGES_MAX):
            result, length = await self._request("tools/list", {"cursor": cursor} if cursor is not None else {},
                                                 timeout)
            page = result.get("tools")
            if not isinstance(page, list):
                raise McpError(f"mcp server {self.name}: tools/list result has no tools list")
            tools.extend(page)
            size += length
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or len(tools) >= MCP_TOOLS_MAX:
                break
            if size >= MCP_LIST_BYTES_MAX:
                log.warning("mcp server %s: tools/list passed %d bytes; the pages after it are left out",
                            self.name, MCP_LIST_BYTES_MAX)
                break
        else:
            log.warning("mcp server %s: tools/list still had pages after %d; the rest is left out",
                        self.name, MCP_PAGES_MAX)
        if len(tools) > MCP_TOOLS_MAX:
            log.warning("mcp server %s lists %d tools; only the first %d are used", self.name, len(tools),
                        MCP_TOOLS_MAX)
        return tools[:MCP_TOOLS_MAX]

    async def call_tool(self, skill: Skill, arguments: dict, timeout: float) -> tuple[dict, int]:
        """tools/call: the CallToolResult and the size of the answer; McpError, or TimeoutError after `timeout`
        seconds, when the request is cancelled (notifications/cancelled)."""
        return await self._request("tools/call", {"name": skill.mcp.tool, "arguments": arguments}, timeout,
                                   cancel_reason="timeout")

    async def ping(self, timeout: float = MCP_PROTOCOL_TIMEOUT) -> None:
        await self.request("ping", None, timeout)

    async def request(self, method: str, params: dict | None, timeout: float) -> dict:
        """Send a request and wait for its result (a dict); McpError, or TimeoutError after `timeout` seconds."""
        return (await self._request(method, params, timeout))[0]

    async def _request(self, method: str, params: dict | None, timeout: float, cancel_reason: str | None = None
                       ) -> tuple[dict, int]:
        """A request's result and the size of the answer; on timeout, with `cancel_reason`, the server is told
        to stop working on it."""
        if self.closed.is_set():
            raise McpError(f"mcp server {self.name} is not running")
        self._next += 1
        ident = self._next
        future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            if cancel_reason is not None and not self.closed.is_set():
                await self.notify("notifications/cancelled", {"requestId": ident, "reason": cancel_reason})
            raise
        except asyncio.CancelledError:       # the call itself was cancelled (shutdown): tell the server too
            if cancel_reason is not None and not self.closed.is_set():
                self.background(self.notify("notifications/cancelled", {"requestId": ident, "reason": "cancelled"}))
            raise
        finally:
            self._pending.pop(ident, None)
            if future.done() and not future.cancelled():
                future.exception()           # the reader may have failed it while the send failed too

    async def notify(self, method: str, params: dict | None = None) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
        except McpError:
            pass                 # a notification to a server that is gone reaches nobody; nothing waits on it

    async def _send(self, message: dict) -> None:
        stdin = self.server.process.stdin
        try:
            stdin.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
                        + b"\n")
            await stdin.drain()
        except (OSError, RuntimeError, UnicodeEncodeError) as exc:
            raise McpError(f"mcp server {self.name}: cannot write to it ({type(exc).__name__})") from None

    async def _read(self) -> None:
        """Answers to their requests, the server's own requests and notifications, until stdout ends."""
        stdout = self.server.process.stdout
        try:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:           # a line past MCP_LINE_MAX: the stream cannot be resynchronised
                    log.warning("mcp server %s sent a message over %d bytes; disconnecting", self.name, MCP_LINE_MAX)
                    break
                if not line:
                    break
                if line.strip():
                    await self._dispatch(line)
        except Exception:                    # never let a hostile server take the daemon's loop down
            log.exception("mcp server %s: reading its output failed", self.name)
        finally:
            self.closed.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(McpError(f"mcp server {self.name} exited"))

    async def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self._junk += 1
            if self._junk <= MCP_STDERR_LINES:
                log.warning("mcp server %s wrote a line that is not JSON (%d bytes); ignored", self.name, len(line))
            return
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:              # a request from the server
                reply: dict = {"jsonrpc": "2.0", "id": message["id"]}
                if method == "ping":
                    reply["result"] = {}
                else:
                    reply["error"] = {"code": -32601, "message": f"method not found: {method[:100]}"}
                try:
                    await self._send(reply)
                except McpError:
                    pass
            elif self._on_notify is not None:
                self._on_notify(method)
            return
        ident = message.get("id")
        future = self._pending.get(ident) if type(ident) is int else None
        if future is None or future.done():
            return
        if isinstance(message.get("result"), dict):
            future.set_result((message["result"], len(line)))
        else:
            error = message.get("error")
            text = error.get("message") if isinstance(error, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            future.set_exception(McpError(f"{str(text)[:500] if text else 'invalid answer'}"
                                          + (f" (code {code})" if isinstance(code, int) else "")))

    async def _stderr(self) -> None:
        """The server's stderr to the log: MCP_STDERR_LINES lines per start, each cut to MCP_STDERR_LINE."""
        stderr = self.server.process.stderr
        logged = skipped = 0
        while True:
            try:
                line = await stderr.readline()
            except ValueError:               # one endless line: drop what is buffered and go on
                skipped += 1
                continue
            except Exception:
                break
            if not line:
                break
            if logged < MCP_STDERR_LINES:
                logged += 1
                log.info("mcp server %s: %s", self.name,
                         line.decode("utf-8", "replace").rstrip()[:MCP_STDERR_LINE])
            else:
                skipped += 1
        if skipped:
            log.info("mcp server %s: %d more stderr lines not logged", self.name, skipped)

    async def wait_closed(self) -> None:
        """Until the server's output has ended and its reader and stderr logger are done."""
        await self.closed.wait()
        await asyncio.wait(self._readers)

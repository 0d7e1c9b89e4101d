"""MCP servers as skills: a stdlib client for the Model Context Protocol over stdio, and the servers' lifecycle.

The wire: JSON-RPC 2.0, one message per line on the server's stdin/stdout; its stderr goes
to the log, a bounded number of cut lines per start. A session is `initialize` (the newest
revision iAs speaks is offered; a server answering with one iAs does not speak is refused),
then `notifications/initialized`. Used: `tools/list` (following `nextCursor`), `tools/call`,
`ping`; a call that times out is followed by `notifications/cancelled`. A server's
`notifications/tools/list_changed` makes iAs list its tools again and replace its skills (a tool that
appears or changes after the first listing is High until the restart: changes.py).
Requests from the server are answered: `ping` with an empty result, anything else with
"method not found" (iAs offers no roots, sampling or elicitation).

Lifecycle (`Servers`): a server is started by the runner (its own process group, the
scrubbed environment) on first use, or at daemon start by `keep`, which also restarts one
that dies, with a delay doubling from MCP_RESTART_FIRST to MCP_RESTART_MAX. Each listing is
written to the data directory (registry.write_tools), so `ias skills` shows the tools without
starting anything; one that changed since the first listing only by the daemon, which tells the
owner (the cache is the next process's first listing). `close` stops every server this process
started: stdin closed, then SIGTERM and SIGKILL to its group. Every background task here (the
keepers, each connection's readers) runs through the `spawn` given at construction: the daemon
passes its supervisor's, so one that dies of anything unexpected takes the daemon down loudly
(STYLE 14); without one (a one-off command) its crash is logged.

`Servers.run(skill, params, user) -> Outcome` is the executor of the skills made of MCP tools
(outcome.py): no exit code (no process runs per call); the size is that of the answer.

Not handled: resources, prompts, sampling, progress notifications, the HTTP transports, and
batches (no revision iAs speaks allows a server to send one unasked).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine

from .limits import (
    MCP_LINE_MAX,
    MCP_LIST_BYTES_MAX,
    MCP_PAGES_MAX,
    MCP_PROTOCOL_TIMEOUT,
    MCP_RESTART_FIRST,
    MCP_RESTART_MAX,
    MCP_STDERR_LINE,
    MCP_STDERR_LINES,
    MCP_STOP_GRACE,
    MCP_TOOLS_MAX,
    MCP_UP_RESET,
)
from . import results
from .outcome import Outcome
from .runner import Runner, Server
from .registry import Registry, mcp_skills, write_tools
from .skills import McpServer, Skill

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")     # newest first; the first is offered
CLIENT_INFO = {"name": "ias", "version": "1"}


class McpError(Exception):
    """The server could not be started, broke the protocol, answered with an error, or went away."""


Spawn = Callable[[Coroutine, str], asyncio.Task]       # runs a named background task (Supervisor.spawn)


def plain_spawn(coro: Coroutine, name: str) -> asyncio.Task:
    """A task outside any supervisor (one-off commands, tests): a crash is logged, nothing else stops."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_log_crash)
    return task


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s crashed", task.get_name(), exc_info=task.exception())


class Connection:
    """One running server and the JSON-RPC session over its pipes."""

    def __init__(self, server: Server, on_notify: Callable[[str], None] | None = None,
                 spawn: Spawn | None = None):
        self.server = server
        self.name = server.name
        self.protocol = ""
        self.info: dict = {}
        self._on_notify = on_notify
        self._next = 0
        self._pending: dict[int, asyncio.Future] = {}
        self.closed = asyncio.Event()
        self.started = time.monotonic()
        self._spawn = spawn = spawn or plain_spawn
        self._tasks = [spawn(self._read(), f"mcp {self.name} reader"), spawn(self._stderr(), f"mcp {self.name} stderr")]
        self._junk = 0                       # lines that were no JSON-RPC message (logged up to MCP_STDERR_LINES)

    def background(self, coro) -> None:
        """A task that must not hold up the reader; kept referenced until it ends."""
        task = self._spawn(coro, f"mcp {self.name} background")
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

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
        await self.closed.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class Servers:
    """Every MCP server of the registry: started when first needed, kept, restarted, stopped by `close`."""

    def __init__(self, registry: Registry, runner: Runner, cache, allow: frozenset[str] = frozenset(), *,
                 restart_first: float = MCP_RESTART_FIRST, restart_max: float = MCP_RESTART_MAX,
                 stop_grace: float = MCP_STOP_GRACE, tells_owner: bool = False, spawn: Spawn | None = None):
        self.registry = registry
        self._spawn = spawn or plain_spawn   # every background task (keepers, readers) runs through it
        # Only a process that tells the owner (the daemon) caches a listing that changed since the first:
        # the cache is the first listing of the next process, where a changed tool is Low again.
        self.tells_owner = tells_owner
        self.runner = runner
        self.cache = cache
        self.allow = allow
        self.restart_first = restart_first
        self.restart_max = restart_max
        self.stop_grace = stop_grace
        self._live: dict[str, Connection] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._keepers: list[asyncio.Task] = []
        self._listings: dict[str, int] = {}       # server -> listings begun (only the newest one is applied)
        self._closing = False
        self.errors: dict[str, str] = {}          # server -> why it is unavailable
        self.findings: dict[str, list[str]] = {}  # server -> problems and warnings of its last listing
        self._stop = asyncio.Event()              # set by close: keepers end

    def __bool__(self) -> bool:
        return bool(self.registry.servers)

    async def connection(self, name: str) -> Connection:
        """The running session with server `name`, started and listed if needed; raises McpError."""
        live = self._live.get(name)
        if live is not None and not live.closed.is_set():
            return live
        if live is not None:              # it died: reap it (and its group) before starting another
            self._live.pop(name, None)
            await self.runner.stop_server(live.server, 0)
        lock = self._starting.setdefault(name, asyncio.Lock())
        async with lock:
            live = self._live.get(name)
            if live is not None and not live.closed.is_set():
                return live
            if self._closing:
                raise McpError(f"mcp server {name} is not running (stopping)")
            spec = self.registry.servers[name]
            try:
                server = await self.runner.start_server(name, spec.command, spec.directory, spec.env, MCP_LINE_MAX,
                                                         spec.sandbox)
            except OSError as exc:
                self.errors[name] = f"cannot start {spec.command[0]!r}: {exc.strerror or exc}"
                raise McpError(f"mcp server {name}: {self.errors[name]}") from None
            conn = Connection(server, lambda method: self._notified(name, method), self._spawn)
            try:
                await conn.initialize()
                await self._refresh(spec, conn)
            except BaseException as exc:
                await self.runner.stop_server(server, 0)
                if isinstance(exc, asyncio.TimeoutError):
                    self.errors[name] = "no answer to initialize or tools/list within the protocol timeout"
                elif isinstance(exc, (McpError, OSError)):     # OSError: the cache could not be written
                    self.errors[name] = str(exc).removeprefix(f"mcp server {name}: ")
                else:
                    raise
                raise McpError(f"mcp server {name}: {self.errors[name]}") from None
            self.errors.pop(name, None)
            self._live[name] = conn
            return conn

    async def _refresh(self, spec: McpServer, conn: Connection) -> None:
        """List the tools, cache the list, put them in the registry; keep the problems and warnings found."""
        number = self._listings[spec.name] = self._listings.get(spec.name, 0) + 1
        tools = await conn.list_tools()
        # Schemas become validators in a worker thread: bounded work (mcp_skills), but never on the loop.
        listing = await asyncio.to_thread(mcp_skills, spec, tools, self.allow, self.registry.compiled(spec.name))
        if number != self._listings[spec.name]:
            return                                # a newer listing (list_changed again) overtook this one
        as_first = self.registry.set_tools(spec, listing)
        for line in (*listing.problems, *listing.warnings):
            log.warning("%s", line)
        self.findings[spec.name] = [*listing.problems, *(f"{w} (warning)" for w in listing.warnings)]
        if as_first or self.tells_owner:
            await asyncio.to_thread(write_tools, self.cache, spec, tools)

    def _notified(self, name: str, method: str) -> None:
        """A server's notification: only tools/list_changed means anything to iAs."""
        conn = self._live.get(name)
        if method == "notifications/tools/list_changed" and conn is not None:
            conn.background(self._relist(name, conn))       # the reader must go on to receive the answer

    async def _relist(self, name: str, conn: Connection) -> None:
        try:
            await self._refresh(self.registry.servers[name], conn)
            log.info("mcp server %s: tool list changed; %s now", name,
                     ", ".join(s.name for s in self.registry if s.mcp and s.mcp.server == name) or "no tools")
        except (McpError, asyncio.TimeoutError, OSError) as exc:
            log.warning("mcp server %s: listing its tools after a change failed: %s", name, exc)

    async def run(self, skill: Skill, params: dict, user: str | None = None) -> Outcome:
        """The executor interface: call MCP tool skill `skill`, starting its server if needed; the call (the start
        included) times out after the skill's timeout. No exit code: no process ran for the call."""
        started = time.monotonic()
        try:
            conn = await asyncio.wait_for(self.connection(skill.mcp.server), skill.timeout)
            answer, size = await conn.call_tool(skill, params, max(0.0, started + skill.timeout - time.monotonic()))
        except TimeoutError:
            return Outcome(skill.name, results.timed_out(skill.name, skill.timeout),
                           duration=time.monotonic() - started, timed_out=True)
        except McpError as exc:
            return Outcome(skill.name, results.mcp_failed(skill.name, str(exc)), duration=time.monotonic() - started)
        shown = results.of_mcp(skill.name, answer)
        return Outcome(skill.name, shown, duration=time.monotonic() - started, output_size=size,
                       truncated=shown.get("truncated") is True)

    async def discover(self, name: str) -> Skill | None:
        """A tool skill not in the registry yet (never listed): start its server and look again."""
        server = name.partition("__")[0]
        if "__" not in name or server not in self.registry.servers or server in self._live:
            return None
        try:
            await self.connection(server)
        except McpError as exc:
            log.warning("%s", exc)
        return self.registry.get(name)

    async def check(self, name: str) -> tuple[list[str], list[str]]:
        """For `skills check` and `doctor`: start server `name`, list its tools; (tool skill names, problems)."""
        spec = self.registry.servers[name]
        try:
            await self.connection(name)
        except McpError as exc:
            return [], [f"{spec.path}:{spec.line}: {exc}"]
        problems = self.findings.get(name, [])
        names = sorted(s.name for s in self.registry if s.mcp is not None and s.mcp.server == name)
        return names, problems

    def keep(self) -> None:
        """Daemon: start every server now and restart one that dies, with backoff."""
        for name in self.registry.servers:
            self._keepers.append(self._spawn(self._keep(name), f"mcp {name} keeper"))

    async def _keep(self, name: str) -> None:
        delay = self.restart_first
        while not self._closing:
            try:
                conn = await self.connection(name)
            except McpError as exc:
                log.warning("%s; retrying in %.0fs", exc, delay)
            else:
                await _first(conn.closed, self._stop)
                if self._closing:
                    return
                code = conn.server.process.returncode
                log.warning("mcp server %s exited (status %s); restarting in %.0fs", name, code, delay)
                await self.runner.stop_server(conn.server, 0)      # reap it and what it left in its group
                if time.monotonic() - conn.started > MCP_UP_RESET:
                    delay = self.restart_first
            await _first(self._stop, timeout=delay)
            delay = min(delay * 2, self.restart_max)

    async def close(self) -> None:
        """Stop every server this process started (every command that starts one calls this before it exits).

        The keepers are told by an event as well as cancelled: Python 3.11's wait_for can swallow a
        cancellation that races an answer."""
        self._closing = True
        self._stop.set()
        for task in self._keepers:
            task.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        live, self._live = list(self._live.values()), {}
        await asyncio.gather(*(self.runner.stop_server(conn.server, self.stop_grace) for conn in live))
        await asyncio.gather(*(conn.wait_closed() for conn in live), return_exceptions=True)


async def _first(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Wait until one of `events` is set, or `timeout` seconds pass."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()

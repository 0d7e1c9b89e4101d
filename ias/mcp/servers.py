"""Every MCP server of the registry: started on first use or kept by the daemon, restarted, listed, stopped;
and `Servers.run`, the executor of the skills made of MCP tools.

See the package docstring for the lifecycle.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..limits import (
    MCP_LINE_MAX,
    MCP_RESTART_FIRST,
    MCP_RESTART_MAX,
    MCP_STOP_GRACE,
    MCP_UP_RESET,
)
from .. import results
from ..outcome import Outcome
from ..runner import Runner
from ..registry import Registry, mcp_skills, write_tools
from ..skills import McpServer, Skill
from ..supervisor import MCP, Supervisor
from .connection import Connection, McpError

log = logging.getLogger(__name__)


class Servers:
    """Every MCP server of the registry: started when first needed, kept, restarted, stopped by `close`."""

    def __init__(self, registry: Registry, runner: Runner, cache, allow: frozenset[str] = frozenset(), *,
                 restart_first: float = MCP_RESTART_FIRST, restart_max: float = MCP_RESTART_MAX,
                 stop_grace: float = MCP_STOP_GRACE, tells_owner: bool = False, supervisor: Supervisor | None = None):
        self.registry = registry
        # Every background task (keepers, readers, relists) runs in the supervisor's MCP group (None: its own).
        self.supervisor = supervisor or Supervisor()
        self.tasks = self.supervisor.scope(MCP)
        self._keepers = self.supervisor.scope(f"{MCP} keepers")
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
            conn = Connection(server, self.tasks, lambda method: self._notified(name, method))
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
            self._keepers.spawn(self._keep(name), f"mcp {name} keeper")

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
        await self._keepers.cancel()
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

"""MCP servers as skills: the stdio client, the lifecycle and the gate, against tests/servers/mcp.py."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import unittest
from pathlib import Path
from unittest import mock

from ias import jsonschema as schema, results
from ias.changes import ADDED, MODIFIED, Change
from ias.errors import SkillError
from ias.mcp.connection import PROTOCOL_VERSIONS
from ias.mcp import servers as mcp_servers
from ias.mcp.servers import Servers
from ias.registry import cached_tools, load_registry, mcp_skills, tool_skill_name
from ias.skills import McpServer, parse_skill
from ias.supervisor import Supervisor
from tests.support import (FIXTURES, REPO, GateTestCase, capture_logs, drop_schema, fixture_copy, fresh_schema_dsn,
                           granted, slow, until, with_env)



class McpTestCase(GateTestCase):
    """The gate over tests/fixtures/mcp (servers `demo` and `picky`); the server's events in self.events."""
    extra_env: dict = {}

    async def asyncSetUp(self) -> None:
        self.user_skills = fixture_copy(self, "mcp")       # with tests/servers/mcp.py in each server's directory
        self.log = granted("events")                        # the servers' ## Sandbox grants GRANTS
        await super().asyncSetUp()

    def runner_environ(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "MCP_TEST_LOG": str(self.log), **self.extra_env}

    def server_pids(self) -> list[int]:
        """The host's pids of the running servers' processes (bwrap and the server: their own pids, which the
        event log shows, are those of their sandboxes)."""
        return with_env(f"MCP_TEST_LOG={self.log}")

    def server_python(self) -> list[int]:
        """The host's pids of the servers' Python processes."""
        return [pid for pid in self.server_pids() if b"mcp.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
                and b"bwrap" not in Path(f"/proc/{pid}/cmdline").read_bytes()]

    async def asyncTearDown(self) -> None:
        await self.app.mcp.close()
        await super().asyncTearDown()

    def events(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def started(self) -> list[list[str]]:
        return [line.split()[1:] for line in self.events() if line.startswith("start ")]

    def audit(self) -> list[tuple]:
        return self.sql("SELECT event, skill_name, risk, decision FROM audit_log ORDER BY id")


class ListingTest(McpTestCase):
    async def test_initialize_and_paged_listing_cached_for_the_next_command(self):
        self.assertNotIn("demo__echo", [s.name for s in self.registry])      # never listed: nothing cached yet
        tools, problems = await self.app.mcp.check("demo")
        self.assertEqual(len(tools), 11)                                    # 6 pages of 2
        self.assertIn("initialized", self.events())
        self.assertIn("demo__lookup", tools)
        self.assertEqual(self.registry.get("demo__echo").mcp.tool, "echo")
        conn = self.app.mcp._live["demo"]
        self.assertEqual(conn.protocol, PROTOCOL_VERSIONS[0])
        # The next process lists the tools from the cache, starting nothing.
        again = load_registry(None, self.user_skills, mcp_cache=self.tmp / "mcp")
        self.assertEqual(sorted(s.name for s in again if s.mcp and s.mcp.server == "demo"), tools)
        self.assertEqual(len(self.started()), 1)
        self.assertTrue(any("propertyNames" in p and p.endswith("(warning)") for p in problems), problems)

    async def test_allow_list_and_risks(self):
        tools, problems = await self.app.mcp.check("picky")
        self.assertEqual(tools, ["picky__add", "picky__echo", "picky__slow", "picky__wipe"])
        risks = {name: self.registry.get(name).risk for name in tools}
        self.assertEqual(risks, {"picky__add": "high", "picky__echo": "low", "picky__slow": "low",
                                 "picky__wipe": "high"})           # wipe: destructiveHint keeps it High
        self.assertTrue(any("'missing'" in p for p in problems), problems)
        spec = self.registry.servers["picky"]
        tools = cached_tools(self.tmp / "mcp", spec)
        allowed = mcp_skills(spec, tools, {"picky__wipe"}).skills
        self.assertEqual(allowed["picky__wipe"].risk, "low")

    async def test_no_page_is_asked_for_past_the_listing_byte_limit(self):
        big = granted("big.json")         # the server reads it: GRANTS
        big.write_text(json.dumps([{"name": f"big{i}", "description": "x" * 200_000} for i in range(30)]))
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_TOOLS": str(big)}))
        records = capture_logs(self)
        tools, _ = await self.app.mcp.check("demo")
        self.assertTrue(11 + 18 <= len(tools) < 11 + 30, len(tools))     # ~4 MiB: about 21 of the 30 tools of 200 kB
        self.assertTrue(any("the pages after it are left out" in r.getMessage() for r in records))

    async def test_older_revision_accepted_unknown_refused(self):
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_VERSION": "2024-11-05"}))
        await self.app.mcp.check("demo")
        self.assertEqual(self.app.mcp._live["demo"].protocol, "2024-11-05")
        await self.app.mcp.close()
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_VERSION": "1999-01-01"}))
        tools, problems = await self.app.mcp.check("demo")
        self.assertEqual(tools, [])
        self.assertIn("speaks protocol revision '1999-01-01'", problems[0])
        self.assertTrue(problems[0].startswith(f"{self.user_skills / 'demo' / 'SKILL.md'}:5: "), problems[0])
        # Its cached tools are still listed, and fail clearly; the other server's work.
        result = await self.gate.call("owner", "demo__echo", {"text": "x"})
        self.assertEqual(result["success"], False)
        self.assertIn("1999-01-01", result["error"])
        self.assertEqual(await self.gate.call("owner", "picky__echo", {"text": "y"}), {"success": True, "output": "y"})


class CallTest(McpTestCase):
    async def test_results_through_the_gate(self):
        gate = self.gate
        self.assertEqual(await gate.call("owner", "demo__echo", {"text": "你好"}), {"success": True, "output": "你好"})
        self.assertEqual(await gate.call("owner", "demo__add", '{"a": 2, "b": 3}'),
                         {"success": True, "output": "5", "data": {"sum": 5}})
        self.assertEqual(await gate.call("owner", "demo__fail", {}), {"success": False, "error": "it went wrong"})
        boom = await gate.call("owner", "demo__boom", {})
        self.assertEqual(boom, {"success": False, "error": "MCP 服务调用失败：demo__boom：boom went the tool (code -32000)"})
        media = await gate.call("owner", "demo__media", {})
        self.assertEqual(media["output"].splitlines(), [
            "see attached", "[image image/png, 100 bytes]", "[resource file:///tmp/x.txt text/plain, 1200 characters]"])
        big = await gate.call("owner", "demo__big", {"size": 70000})
        self.assertEqual((len(big["output"]), big["truncated"]), (64 * 1024, True))
        self.assertEqual(await gate.call("owner", "demo__lookup", {"where": "上海"}), {"success": True, "output": "found 上海"})
        self.assertEqual(len(self.started()), 1)                        # one warm server for every call
        rows = self.audit()
        self.assertEqual(rows[:2], [("skill_started", "demo__echo", "low", "auto"),
                                    ("skill_finished", "demo__echo", "low", "auto")])
        self.assertEqual(self.sql("SELECT truncated FROM audit_log WHERE skill_name = 'demo__big' "
                                  "AND event = 'skill_finished'"), [(True,)])

    async def test_invalid_arguments_never_reach_the_server(self):
        result = await self.gate.call("owner", "demo__add", {"a": "x", "b": 1})
        self.assertTrue(result["error"].startswith("参数错误：$.a"), result)
        result = await self.gate.call("owner", "demo__lookup", {"where": "x"})     # via the inlined $ref
        self.assertTrue(result["error"].startswith("参数错误：$.where"), result)
        self.assertNotIn("call add", self.events())
        self.assertNotIn("call lookup", self.events())

    async def test_high_tool_needs_the_code(self):
        task = asyncio.create_task(self.gate.call("owner", "picky__add", {"a": 1, "b": 1}, self.owner.notify))
        code = await self.owner.code()
        self.assertIn("技能：picky__add", self.owner.messages[-1])
        self.assertNotIn("call add", self.events())
        await self.approvals.redeem("owner", code)
        self.assertEqual(await task, {"success": True, "output": "2", "data": {"sum": 2}})
        self.assertIn(("skill_finished", "picky__add", "high", "approved"), self.audit())

    async def test_timeout_cancels_the_request(self):
        result = await self.gate.call("owner", "picky__slow", {})
        self.assertEqual(result, {"success": False, "error": "技能执行超时（1s）：picky__slow"})
        await until(lambda: any(line.startswith("cancelled ") for line in self.events()))
        self.assertIn(("skill_finished", "picky__slow", "low", "timeout"), self.audit())
        self.assertEqual(await self.gate.call("owner", "picky__echo", {"text": "still"}),
                         {"success": True, "output": "still"})              # the same server goes on

    async def test_crash_then_a_new_server_on_the_next_call(self):
        await self.app.mcp.check("demo")
        result = await self.gate.call("owner", "demo__crash", {})
        self.assertFalse(result["success"])
        self.assertIn("exited", result["error"])
        self.assertEqual(await self.gate.call("owner", "demo__echo", {"text": "back"}),
                         {"success": True, "output": "back"})
        self.assertEqual(len(self.started()), 2)

    async def test_list_changed_refreshes_the_skills(self):
        await self.app.mcp.check("demo")
        self.assertNotIn("demo__extra", [t["function"]["name"] for t in self.agent.catalog.select("")])
        self.assertEqual((await self.gate.call("owner", "demo__grow", {}))["output"], "grown")
        await until(lambda: self.registry.get("demo__extra") is not None)
        self.assertIn("demo__extra", [t["function"]["name"] for t in self.agent.catalog.select("")])
        # Not cached by a process that does not tell the owner: the daemon's start lists it as new.
        self.assertNotIn("extra", json.dumps(cached_tools(self.tmp / "mcp", self.registry.servers["demo"])))

    async def test_model_sees_the_servers_schema(self):
        await self.app.mcp.check("demo")
        spec = next(t for t in self.agent.catalog.select("") if t["function"]["name"] == "demo__lookup")
        self.assertEqual(spec["function"]["parameters"]["$defs"]["place"]["propertyNames"], True)
        self.assertNotIn("$defs", self.registry.get("demo__lookup").parameters)


def fan_out(levels: int = 8, width: int = 4, leaves: int = 40) -> dict:
    """A small schema whose `$ref`s expand to width**levels copies of a `leaves`-property object."""
    defs = {"d0": {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 5}
                                                   for i in range(leaves)}}}
    for i in range(1, levels):
        defs[f"d{i}"] = {"properties": {f"k{j}": {"$ref": f"#/$defs/d{i - 1}"} for j in range(width)}}
    return {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{levels - 1}"}}, "$defs": defs}


class FirstListingTest(McpTestCase):
    """A Low risk is never inferred: only the tools of the first listing, unchanged, keep the Low of `## Risk Level`."""

    async def relisted(self, **args) -> None:
        """Call demo__grow and wait until the server's new list is in the registry."""
        generation = self.registry.generation
        self.assertEqual((await self.gate.call("owner", "demo__grow", args))["output"], "grown")
        await until(lambda: self.registry.generation > generation)

    async def test_a_tool_that_appears_later_is_high_until_the_restart_and_told_once(self):
        await self.app.mcp.check("demo")
        self.assertEqual(self.registry.get("demo__echo").risk, "low")
        self.assertEqual(self.registry.take_changes(), [])                 # the first listing is no news
        await self.relisted()
        self.assertEqual(self.registry.get("demo__extra").risk, "high")
        await self.relisted()                                              # listed again: not told again
        self.assertEqual(self.registry.take_changes(), [Change("demo__extra", ADDED)])
        task = asyncio.create_task(self.gate.call("owner", "demo__extra", {}, self.owner.notify))
        await self.approvals.redeem("owner", await self.owner.code())
        self.assertEqual(await task, {"success": True, "output": "extra ran"})
        self.assertIn(("skill_finished", "demo__extra", "high", "approved"), self.audit())

    async def test_the_daemon_caches_a_changed_listing_for_its_restart(self):
        servers = Servers(self.registry, self.runner, self.tmp / "mcp", tells_owner=True)
        try:
            await servers.check("demo")
            await servers.run(self.registry.get("demo__grow"), {}, "owner")
            await until(lambda: "extra" in json.dumps(cached_tools(self.tmp / "mcp", self.registry.servers["demo"])))
            self.assertEqual(self.registry.get("demo__extra").risk, "high")
        finally:
            await servers.close()
        self.use(self.build())                                             # the restart: its cached list is the first
        self.assertEqual(self.registry.get("demo__extra").risk, "low")

    async def test_a_tool_whose_description_changes_is_high(self):
        await self.app.mcp.check("demo")
        await self.relisted(describe="Echo the text, and mail it to someone else.")
        echo = self.registry.get("demo__echo")
        self.assertEqual((echo.risk, echo.description), ("high", "Echo the text, and mail it to someone else."))
        self.assertEqual(self.registry.take_changes(), [Change("demo__echo", MODIFIED)])
        await self.relisted(describe="Echo the text.")                     # back as it was: still High
        self.assertEqual(self.registry.get("demo__echo").risk, "high")
        self.assertEqual(self.registry.get("demo__add").risk, "low")        # the others are as they were

    async def test_a_new_server_version_is_high_against_the_cached_list(self):
        await self.app.mcp.check("demo")                                   # cached: the first listing of what follows
        await self.app.mcp.close()
        newer = granted("newer.json")      # the server reads it: GRANTS
        newer.write_text(json.dumps([
            {"name": "echo", "description": "Echo the text.", "inputSchema": {**json.loads(json.dumps(
                {"type": "object", "properties": {"text": {"type": "string"}, "to": {"type": "string"}},
                 "required": ["text"]}))}},
            {"name": "later", "description": "New in this version.", "inputSchema": {"type": "object"}},
            {"name": "add", "description": "Add two integers.", "annotations": {"readOnlyHint": True},
             "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"], "additionalProperties": False}}]))
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_TOOLS": str(newer)}))
        self.assertEqual(self.registry.get("demo__echo").risk, "low")       # as cached
        await self.app.mcp.check("demo")
        risks = {n: self.registry.get(n).risk for n in ("demo__echo", "demo__later", "demo__add", "demo__fail")}
        self.assertEqual(risks, {"demo__echo": "high", "demo__later": "high", "demo__add": "high", "demo__fail": "low"})
        self.assertEqual(sorted(self.registry.take_changes(), key=lambda c: c.name),
                         [Change("demo__add", MODIFIED), Change("demo__echo", MODIFIED), Change("demo__later", ADDED)])

    async def test_a_tool_without_a_description_or_title_lists_fine(self):
        bare = granted("bare.json")        # the server reads it: GRANTS
        bare.write_text(json.dumps([{"name": "bare", "title": "", "description": "", "inputSchema": {"type": "object"}},
                                    {"name": "blank", "description": " \n ", "inputSchema": {"type": "object"}}]))
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_TOOLS": str(bare)}))
        await self.app.mcp.check("demo")
        listing = await self.agent.turn("owner", "/skills", None)
        self.assertIn("demo__bare（低风险）：bare", listing.splitlines())
        self.assertIn("demo__blank（低风险）：blank", listing.splitlines())

    async def test_a_fan_out_schema_is_refused_in_a_worker_thread_and_the_loop_keeps_ticking(self):
        hostile = granted("hostile.json")
        hostile.write_text(json.dumps([{"name": f"fan{i}", "inputSchema": fan_out()} for i in range(2)]))
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_TOOLS": str(hostile)}))
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now
        threads: list[str] = []
        listed = mcp_servers.mcp_skills

        def in_thread(*args):                           # the schema checks run off the event loop
            threads.append("main" if threading.current_thread() is threading.main_thread() else "worker")
            return listed(*args)
        ticker = asyncio.create_task(tick())
        try:
            started = time.monotonic()
            with mock.patch.object(mcp_servers, "mcp_skills", in_thread):
                tools, problems = await self.app.mcp.check("demo")
            took = time.monotonic() - started
            await asyncio.sleep(0.05)                   # the ticker notes the gap it may just have lived through
        finally:
            ticker.cancel()
        self.assertLess(took, 10)
        self.assertEqual(threads, ["worker"])
        self.assertLess(max(gaps), 1.0, f"the loop stood still {max(gaps):.3f}s")
        self.assertNotIn("demo__fan0", tools)
        self.assertIn("demo__echo", tools)
        refused = [p for p in problems if "fan" in p]
        self.assertEqual(len(refused), 2, problems)
        self.assertIn("not loaded: its schema passes 10000 nodes after $ref expansion (warning)", refused[0])

    async def test_a_new_spec_reuses_the_compiled_schemas(self):
        await self.app.mcp.check("demo")
        spec = self.registry.servers["demo"]
        again = mcp_skills(spec, cached_tools(self.tmp / "mcp", spec), compiled=self.registry.compiled("demo"))
        self.assertIs(again.skills["demo__lookup"].validator, self.registry.get("demo__lookup").validator)


class LifecycleTest(McpTestCase):
    def alive(self, pid: int) -> bool:
        """Running: a zombie left to a container's init that never reaps (a sandbox's orphaned init) is gone."""
        try:
            return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
        except OSError:
            return False

    async def test_own_group_scrubbed_env_and_stop(self):
        await self.app.mcp.check("demo")
        _pid, _pgid, home = self.started()[0]
        pids = self.server_pids()
        groups = {os.getpgid(pid) for pid in pids}
        self.assertEqual(len(groups), 1)                                    # its own process group,
        self.assertIn(groups.pop(), pids)                                   # led by its sandbox
        self.assertTrue(home.startswith(str(self.tmp / "runs")))
        with open(f"/proc/{self.server_python()[0]}/environ", "rb") as f:
            names = {item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item}
        self.assertNotIn("IAS_DATABASE_URL", names)
        self.assertIn("MCP_TEST_LOG", names)
        await self.app.mcp.close()
        self.assertIn("stdin closed", self.events())                        # asked politely first
        self.assertEqual([pid for pid in pids if self.alive(pid)], [])
        self.assertFalse(Path(home).exists(), home)

    async def test_sigterm_when_stdin_is_not_enough(self):
        self.use(self.build(environ={**self.runner_environ(), "MCP_TEST_IGNORE_TERM": "1"}))
        servers = Servers(self.registry, self.runner, self.tmp / "mcp", stop_grace=0.1)
        await servers.check("demo")
        pid = self.server_python()[0]
        os.kill(pid, signal.SIGSTOP)             # it cannot read stdin, and it ignores SIGTERM: only SIGKILL ends it
        await servers.close()
        self.assertFalse(self.alive(pid))

    async def test_daemon_restarts_a_server_that_dies(self):
        servers = Servers(self.registry, self.runner, self.tmp / "mcp", restart_first=0.05)
        servers.keep()
        try:
            await until(lambda: len(self.started()) == 2)                  # demo and picky at start
            pid = self.server_python()[0]
            os.kill(pid, 9)
            await until(lambda: len(self.started()) == 3)
            self.assertFalse(self.alive(pid))                               # reaped
        finally:
            await servers.close()
        self.assertEqual(self.server_pids(), [])

    async def test_a_keeper_dying_of_the_unexpected_stops_the_daemon_loudly(self):
        # STYLE 14: a keeper dying of anything but McpError used to vanish with its bare ensure_future.
        records = capture_logs(self)
        supervisor = Supervisor(daemon=True)
        servers = Servers(self.registry, self.runner, self.tmp / "mcp", supervisor=supervisor)
        with mock.patch.object(self.runner, "start_server", side_effect=RuntimeError("unexpected")):
            servers.keep()
            await asyncio.wait_for(supervisor.failed.wait(), 10)
            await servers.close()
        self.assertRegex(supervisor.reason, r"task mcp (demo|picky) keeper crashed: RuntimeError\('unexpected'\)")
        self.assertTrue(any(r.levelname == "CRITICAL" and r.exc_info for r in records))

    async def test_in_a_one_off_a_dying_keeper_is_logged_with_its_traceback(self):
        records = capture_logs(self)
        servers = Servers(self.registry, self.runner, self.tmp / "mcp")      # a supervisor of its own
        with mock.patch.object(self.runner, "start_server", side_effect=RuntimeError("unexpected")):
            servers.keep()
            await until(lambda: sum("keeper crashed" in r.getMessage() for r in records) == 2)
            await servers.close()
        self.assertTrue(all(r.exc_info for r in records if "keeper crashed" in r.getMessage()))
        self.assertTrue(servers.supervisor.failed.is_set())                 # for the command to decide


class SkillFileTest(unittest.TestCase):
    def parse(self, text: str):
        return parse_skill(Path("/x/srv/SKILL.md"), text)

    def test_mcp_skill(self):
        spec = self.parse("# S\n\nd\n\n## MCP\n`npx -y \"@scope/server x\" --flag`\n\n## Risk Level\nHigh\n\n"
                          "## Tools\n- read_file: Low\n- write_file：高\n\n## Timeout\n12\n")
        self.assertIsInstance(spec, McpServer)
        self.assertEqual(spec.command, ("npx", "-y", "@scope/server x", "--flag"))
        self.assertEqual((spec.risk, spec.tools, spec.timeout), ("high", {"read_file": "low", "write_file": "high"}, 12))

    def test_problems(self):
        for text, needle in (
                ("# S\n\nd\n\n## MCP\nx\n\n## Risk Level\nLow\n\n## Execute\n```bash\ntrue\n```\n", "cannot go with"),
                ("# S\n\nd\n\n## MCP\nx\ny\n\n## Risk Level\nLow\n", "exactly one line"),
                ("# S\n\nd\n\n## MCP\nx 'open\n\n## Risk Level\nLow\n", "cannot split"),
                ("# S\n\nd\n\n## MCP\nx\n\n## Risk Level\nLow\n\n## Tools\nread: Maybe\n", "'tool: Low'"),
                ("# S\n\nd\n\n## MCP\nx\n\n", "missing required section '## Risk Level'"),
                ("# S\n\nd\n\n## Risk Level\nLow\n\n## Tools\nread: Low\n\n## Parameters\n```json\n{\"type\": \"object\"}\n```"
                 "\n\n## Execute\n```bash\ntrue\n```\n", "belongs to an MCP skill")):
            with self.assertRaises(SkillError) as caught:
                self.parse(text)
            self.assertIn(needle, str(caught.exception))

    def test_tool_names(self):
        self.assertEqual(tool_skill_name("fs", "Read-File.v2"), "fs__read_file_v2")
        spec = self.parse("# S\n\nd\n\n## MCP\nx\n\n## Risk Level\nLow\n")
        listing = mcp_skills(spec, [{"name": "x" * 70}, {"name": "a.b"}, {"name": "a_b"}, {"oops": 1},
                                    {"name": "t", "inputSchema": {"type": "array"}}])
        self.assertEqual(list(listing.skills), ["srv__a_b"])
        self.assertEqual(len(listing.problems), 4, listing.problems)


class RiskTest(unittest.TestCase):
    def server(self, risk: str, tools: str = "") -> McpServer:
        return parse_skill(Path("/x/srv/SKILL.md"), f"# S\n\nd\n\n## MCP\nx\n\n## Risk Level\n{risk}\n{tools}")

    def test_annotations_never_lower_a_risk(self):
        tools = [{"name": "peek", "annotations": {"readOnlyHint": True}},
                 {"name": "both", "annotations": {"readOnlyHint": True, "destructiveHint": True}},
                 {"name": "plain"}, {"name": "gentle", "annotations": {"destructiveHint": False}}]
        high = mcp_skills(self.server("High"), tools).skills
        self.assertEqual({n: s.risk for n, s in high.items()},
                         {"srv__peek": "high", "srv__both": "high", "srv__plain": "high", "srv__gentle": "high"})
        low = mcp_skills(self.server("Low"), tools).skills
        self.assertEqual({n: s.risk for n, s in low.items()},
                         {"srv__peek": "low", "srv__both": "high", "srv__plain": "low", "srv__gentle": "low"})
        named = mcp_skills(self.server("High", "\n## Tools\n- both: Low\n"), tools, {"srv__both"}).skills
        self.assertEqual({n: s.risk for n, s in named.items()}, {"srv__both": "low"})   # named Low and allowed

    def test_a_fan_out_is_refused_within_its_budget(self):
        tools = [{"name": f"fan{i}", "inputSchema": fan_out()} for i in range(3)] + [{"name": "echo"}]
        started = time.monotonic()
        listing = mcp_skills(self.server("Low"), tools)
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(list(listing.skills), ["srv__echo"])
        self.assertEqual(len([w for w in listing.warnings if "10000 nodes after $ref expansion" in w]), 3)
        tracemalloc.start()
        try:
            mcp_skills(self.server("Low"), tools)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 32 * 1024 * 1024)

    def test_all_of_a_servers_schemas_share_one_budget(self):
        wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(4000)}}   # 8,003 nodes
        tools = [{"name": f"t{i}", "inputSchema": wide} for i in range(7)]
        listing = mcp_skills(self.server("Low"), tools)
        self.assertEqual(len(listing.skills), 6)
        self.assertEqual(len(listing.warnings), 1)
        self.assertIn("what is left of 50000 schema nodes", listing.warnings[0])

    def test_long_patterns_cost_their_length(self):
        patterns = {"type": "object", "properties": {
            f"p{i}": {"type": "string", "pattern": "^(" + "|".join(f"w{i}x{j:04d}" for j in range(120)) + ")$"}
            for i in range(60)}}                                     # 60 patterns of ~1,000 characters
        started = time.monotonic()
        listing = mcp_skills(self.server("Low"), [{"name": "p", "inputSchema": patterns}])
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(listing.skills, {})
        self.assertIn("not loaded: its schema passes 10000 nodes", listing.warnings[0])

    def test_a_chain_deeper_than_the_limit_after_expansion_is_refused(self):
        defs = {"d0": {"type": "string"}, **{f"d{i}": {"not": {"$ref": f"#/$defs/d{i - 1}"}} for i in range(1, 40)}}
        listing = mcp_skills(self.server("Low"), [{"name": "deep", "inputSchema": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/d39"}}, "$defs": defs}}])
        self.assertEqual(listing.skills, {})
        self.assertIn("nested deeper than 64 levels after $ref expansion", "\n".join(listing.problems))


class RelaxTest(unittest.TestCase):
    def test_draft07_and_refs(self):
        given = {"$schema": "http://json-schema.org/draft-07/schema#", "$id": "x", "title": "T", "type": "object",
                 "definitions": {"n": {"type": "integer", "minimum": 1}, "loop": {"$ref": "#/definitions/loop"}},
                 "properties": {"n": {"$ref": "#/definitions/n", "description": "count"},
                                "l": {"$ref": "#/definitions/loop"}, "o": {"$ref": "http://elsewhere/x"},
                                "t": {"type": "array", "items": [{"type": "string"}], "contains": {}}},
                 "patternProperties": {"^x": {}}}
        relaxed, dropped = schema.relax(given)
        self.assertEqual(schema.check(relaxed), [])
        self.assertEqual(relaxed["properties"]["n"], {"allOf": [{"type": "integer", "minimum": 1}], "description": "count"})
        self.assertEqual(schema.validate({"n": 0}, relaxed), ["$.n: must be >= 1"])
        self.assertEqual(schema.validate({"n": 2, "t": [1]}, relaxed), [])
        text = "\n".join(dropped)
        for needle in ("recursive $ref", "unresolvable $ref 'http://elsewhere/x'", "$.properties.t.items",
                       "'contains'", "$.patternProperties"):
            self.assertIn(needle, text)
        self.assertNotIn("$schema", text)
        self.assertIn("$schema", given)                                       # the model's copy is untouched


class ResultTest(unittest.TestCase):
    def test_content_kinds(self):
        answer = {"content": [{"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
                              {"type": "resource_link", "uri": "file:///a", "name": "a"}, {"type": "weird"}, "junk"]}
        self.assertEqual(results.of_mcp("s", answer)["output"].splitlines(),
                         ["[audio audio/wav, 3 bytes]", "[resource link file:///a a]", "[weird content]"])
        self.assertEqual(results.of_mcp("s", {"isError": True}), {"success": False, "error": "MCP 工具报告错误：s"})
        huge = {"content": [], "structuredContent": {"k": "v" * 70000}}
        self.assertEqual(results.of_mcp("s", huge), {"success": True, "output": "", "truncated": True})


@slow
class CliTest(unittest.TestCase):
    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-mcp-cli-"))
        self.log = granted("events")
        self.env = {**os.environ, "IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp),
                    "IAS_SKILLS_DIR": str(fixture_copy(self, "mcp")), "MCP_TEST_LOG": str(self.log)}
        self.env.pop("IAS_CONFIG", None)

    def tearDown(self):
        drop_schema(self.schema_name)
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def ias(self, *args: str, **env) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              env={**self.env, **env}, cwd=self.tmp, timeout=60, stdin=subprocess.DEVNULL)

    def test_skills_check_then_listing_and_run(self):
        listed = self.ias("skills")
        self.assertNotIn("demo__echo", listed.stdout)
        self.assertIn("mcp server demo: tools not listed yet", listed.stderr)
        check = self.ias("skills", "check")
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)    # warnings alone
        self.assertIn("mcp server demo: 11 tools", check.stderr)
        self.assertIn("propertyNames", check.stdout)
        rows = {r["name"]: r for r in json.loads(self.ias("skills", "--json").stdout)}
        self.assertEqual((rows["demo__echo"]["server"], rows["demo__wipe"]["risk"]), ("demo", "high"))
        self.assertRegex(self.ias("skills").stdout, r"demo__echo\s+user\s+low\s+10s\s+demo")
        run = self.ias("run", "demo__echo", '{"text": "hi"}')
        self.assertEqual((run.returncode, json.loads(run.stdout)), (0, {"success": True, "output": "hi"}), run.stderr)
        events = self.log.read_text().splitlines()
        starts = [line.split()[1] for line in events if line.startswith("start ")]
        self.assertEqual(len(starts), 3)                  # check: demo, picky; run: demo
        self.assertEqual(events.count("stdin closed"), 3)  # every command stopped what it started
        self.assertEqual(with_env(f"MCP_TEST_LOG={self.log}"), [])

    def test_run_starts_a_server_never_listed(self):
        run = self.ias("run", "picky__echo", '{"text": "first"}')
        self.assertEqual(json.loads(run.stdout), {"success": True, "output": "first"}, run.stderr)

    def test_broken_server(self):
        check = self.ias("skills", "check", IAS_SKILLS_DIR=str(FIXTURES / "mcp_broken"))
        self.assertEqual(check.returncode, 1)
        self.assertIn(f"{FIXTURES / 'mcp_broken' / 'ghost' / 'SKILL.md'}:5: mcp server ghost: cannot start",
                      check.stdout)
        doctor = self.ias("doctor", IAS_SKILLS_DIR=str(FIXTURES / "mcp_broken"))
        self.assertRegex(doctor.stdout, r"FAIL  mcp server ghost: .*cannot start './no-such-server'")
        run = self.ias("run", "get_current_datetime", '{"format": "date"}', IAS_SKILLS_DIR=str(FIXTURES / "mcp_broken"))
        self.assertEqual(run.returncode, 0, run.stderr)                     # the other skills work


if __name__ == "__main__":
    unittest.main()

"""Hot reload: added, changed and removed skills are noticed without a restart; a broken edit keeps the
last good version and is reported once; a pending approval keeps the version it was asked for."""
import asyncio
import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path

from ias.app import watch_skills
from ias.llm import LLM
from ias.registry import load_registry
from tests.servers.llm import LLMServer, calls, text
from tests.support import FIXTURES, FakeChannel, GateTestCase, capture_logs
from tests.test_daemon import DaemonTestCase, Lines

SKILL = """# {title}

{description}

## Risk Level
{risk}

## Parameters
```json
{{"type": "object", "properties": {{"marker": {{"type": "string", "title": "标记文件"}}}}}}
```

## Execute
```bash
{script}
```
"""


def write(root: Path, name: str, description: str = "Says hello.", script: str = "echo hello", risk: str = "Low",
          broken: bool = False, sandbox: str = "") -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    body = SKILL.format(title=name, description=description, script=script, risk=risk)
    if sandbox:
        body += f"\n## Sandbox\n{sandbox}\n"
    if broken:
        body = body.replace('"object"', '"object",')       # invalid JSON in ## Parameters
    (directory / "SKILL.md").write_text(body, encoding="utf-8")
    return directory / "SKILL.md"


class RegistryReloadTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="ias-reload-"))
        self.addCleanup(shutil.rmtree, self.root, True)
        write(self.root, "alpha")
        self.registry = load_registry(None, self.root)

    def test_unchanged_directories_cost_a_stat_scan_and_change_nothing(self):
        generation = self.registry.generation
        self.assertFalse(self.registry.reload())
        self.assertEqual(self.registry.generation, generation)

    def test_added_changed_and_removed_skills(self):
        write(self.root, "beta")
        self.assertTrue(self.registry.reload())
        self.assertEqual([s.name for s in self.registry], ["alpha", "beta"])
        write(self.root, "alpha", description="Says hello, louder than before.")
        self.assertTrue(self.registry.reload())
        self.assertEqual(self.registry.get("alpha").description, "Says hello, louder than before.")
        shutil.rmtree(self.root / "beta")
        self.assertTrue(self.registry.reload())
        self.assertIsNone(self.registry.get("beta"))

    def test_a_broken_edit_keeps_the_last_good_version_and_is_reported_once(self):
        records = capture_logs(self)
        path = write(self.root, "alpha", script="echo new", broken=True)
        self.registry.reload()
        self.assertEqual(self.registry.get("alpha").execute, "echo hello")
        [problem] = self.registry.problems
        self.assertTrue(problem.startswith(f"{path}:10: invalid JSON in ## Parameters"), problem)
        self.assertEqual(self.registry.take_new_problems(), [problem])
        self.assertFalse(self.registry.reload())
        os.utime(path)                              # touched, still broken: not told again
        self.registry.reload()
        self.assertEqual(self.registry.take_new_problems(), [])
        self.assertEqual(sum(problem in r.getMessage() for r in records), 1)
        write(self.root, "alpha", script="echo fixed")
        self.assertTrue(self.registry.reload())
        self.assertEqual((self.registry.get("alpha").execute, self.registry.problems), ("echo fixed", ()))

    def test_a_new_skill_that_never_loaded_is_not_offered(self):
        write(self.root, "gamma", broken=True)
        self.assertFalse(self.registry.reload())
        self.assertIsNone(self.registry.get("gamma"))
        self.assertEqual(len(self.registry.take_new_problems()), 1)


class DaemonReloadTest(GateTestCase):
    """The agent, the gate and the daemon's watcher over a skills directory edited while they run."""

    async def asyncSetUp(self):
        self.user_dir = Path(tempfile.mkdtemp(prefix="ias-reload-"))
        shutil.copytree(FIXTURES / "gate", self.user_dir, dirs_exist_ok=True)
        self.user_skills = self.user_dir
        await super().asyncSetUp()
        self.server = LLMServer().__enter__()
        self.llm = LLM("sk-test", self.server.base_url, "test-model", retry_delays=(0.01,))
        self.use(self.build(llm=self.llm))

    async def asyncTearDown(self):
        await self.llm.close()
        await asyncio.to_thread(self.server.__exit__)
        await super().asyncTearDown()
        shutil.rmtree(self.user_dir, ignore_errors=True)

    def offered(self, request: int) -> list[str]:
        return [t["function"]["name"] for t in self.server.requests[request]["tools"]]

    async def test_a_skill_added_while_running_is_used_on_the_next_turn_and_a_broken_edit_keeps_it(self):
        self.server.script(text("一"), calls(("greet", {})), text("二"), calls(("greet", {})), text("三"))
        await self.agent.turn("owner", "你好", None)
        self.assertNotIn("greet", self.offered(0))
        write(self.user_dir, "greet", script="echo hi from greet")
        self.assertEqual(await self.agent.turn("owner", "打个招呼", None), "二")
        self.assertIn("greet", self.offered(1))
        self.assertEqual(json.loads(self.server.requests[2]["messages"][-1]["content"]),
                         {"success": True, "output": "hi from greet\n"})
        write(self.user_dir, "greet", script="echo broken", broken=True)
        self.assertEqual(await self.agent.turn("owner", "再打个招呼", None), "三")
        self.assertEqual(json.loads(self.server.requests[4]["messages"][-1]["content"]),
                         {"success": True, "output": "hi from greet\n"})
        self.server.assert_complete()

    async def test_a_pending_approval_keeps_the_version_it_was_asked_for(self):
        grant = f"- write: {self.marker.parent}"       # GRANTS, where the marker is
        write(self.user_dir, "stamp", script='echo v1 >> "$IAS_PARAM_MARKER"', risk="High", sandbox=grant)
        self.registry.reload()
        call = asyncio.create_task(self.gate.call("owner", "stamp", {"marker": str(self.marker)}, self.owner.notify))
        code = await self.owner.code()
        write(self.user_dir, "stamp", script='echo v2 >> "$IAS_PARAM_MARKER"', risk="High", sandbox=grant)
        self.assertTrue(self.registry.reload())
        await self.approvals.redeem("owner", code)
        self.assertTrue((await call)["success"])
        self.assertEqual(self.marker.read_text(), "v1\n")
        self.assertIn("v2", self.registry.get("stamp").execute)

    async def test_the_watcher_tells_the_owner_once_on_the_console(self):
        console = FakeChannel("console")
        watcher = asyncio.create_task(watch_skills(self.registry, console, "owner", interval=0.01))
        try:
            path = write(self.user_dir, "echo_low", broken=True)
            message = await console.wait_for("技能未能加载")
            self.assertIn(f"{path}:10:", message)
            write(self.user_dir, "late")
            await asyncio.wait_for(self._until_loaded("late"), 10)
            await asyncio.sleep(0.05)                 # a few more scans: the broken file is not told again
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self.assertEqual(len(console.sent), 1)
        self.assertIsNotNone(self.registry.get("echo_low"))     # its last good version

    async def _until_loaded(self, name: str) -> None:
        while self.registry.get(name) is None:
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    unittest.main()


class RunningDaemonTest(DaemonTestCase):
    """The real daemon process: a skill added while it runs is used on the next turn, without a restart."""

    def test_added_skill_used_next_turn_and_a_broken_edit_told_once(self):
        skills = self.tmp / "skills"
        shutil.copytree(FIXTURES / "gate", skills)
        proc = self.daemon(env={"IAS_SKILLS_DIR": str(skills)})
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running")
        self.say(proc, "/run greet {}")
        at = out.wait_for("未知技能：greet")
        write(skills, "greet", script="echo hi from greet")
        self.say(proc, "/run greet {}")
        at = out.wait_for("hi from greet", start=at + 1)
        path = write(skills, "greet", script="echo broken", broken=True)
        told = out.wait_for("技能未能加载", start=at + 1)
        self.assertIn(f"{path}:10: invalid JSON in ## Parameters", out.lines[told])
        log.wait_for(f"{path}:10: invalid JSON in ## Parameters")
        self.say(proc, "/run greet {}")
        at = out.wait_for("hi from greet", start=told + 1)        # the last good version
        self.say(proc, "/run greet {}")
        out.wait_for("hi from greet", start=at + 1)
        self.assertEqual(sum("技能未能加载" in line for line in out.lines), 1)
        proc.terminate()
        self.assertEqual(proc.wait(timeout=30), 0)

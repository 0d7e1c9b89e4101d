"""Hot reload: added, changed and removed skills are noticed without a restart; a broken edit keeps the
last good version and is reported once; a pending approval keeps the version it was asked for."""
import asyncio
import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path

from ias.daemon import watch_skills
from ias.changes import ADDED, LOWERED, MODIFIED, Change
from ias.registry import load_registry
from tests.support import FIXTURES, FakeChannel, GateTestCase, ScriptedLLM, answer, ask, capture_logs, granted
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


class RiskFloorTest(unittest.TestCase):
    """A reload never lowers a risk before the restart, and every added or changed skill is one Change."""

    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="ias-floor-"))
        self.addCleanup(shutil.rmtree, self.root, True)
        self.system, self.user = self.root / "system", self.root / "user"
        write(self.system, "shell", risk="High", script="bash -c \"$IAS_PARAM_MARKER\"")
        write(self.user, "alpha")
        write(self.user, "pc", risk="High")

    def registry(self, allow=frozenset()):
        return load_registry(self.system, self.user, allow)

    def risks(self, registry) -> dict[str, str]:
        return {s.name: s.risk for s in registry}

    def test_nothing_is_told_for_the_skills_loaded_at_start(self):
        registry = self.registry()
        self.assertEqual(registry.take_changes(), [])
        self.assertFalse(registry.reload())
        self.assertEqual(registry.take_changes(), [])

    def test_a_skill_lowered_to_low_stays_high_until_a_restart_and_is_told_once(self):
        registry = self.registry()
        write(self.user, "pc", risk="Low")
        registry.reload()
        self.assertEqual(registry.get("pc").risk, "high")
        self.assertEqual(registry.take_changes(), [Change("pc", LOWERED)])
        os.utime(self.user / "pc" / "SKILL.md", ns=(1, 1))             # read again, nothing new
        registry.reload()
        self.assertEqual((registry.get("pc").risk, registry.take_changes()), ("high", []))
        write(self.user, "pc", risk="Low", script="echo changed")       # another change of the Low version
        registry.reload()
        self.assertEqual((registry.get("pc").risk, registry.take_changes()), ("high", [Change("pc", MODIFIED)]))
        self.assertEqual(self.registry().get("pc").risk, "low")          # the restart

    def test_a_new_skill_under_a_high_name_stays_high(self):
        registry = self.registry({"shell"})
        shutil.rmtree(self.user / "pc")
        registry.reload()
        write(self.user, "pc", risk="Low")                              # removed, then planted again as Low
        write(self.user, "shell", risk="Low", script="echo planted")    # over the system skill, even when allowed
        registry.reload()
        self.assertEqual((self.risks(registry)["pc"], self.risks(registry)["shell"]), ("high", "high"))
        self.assertEqual(sorted(registry.take_changes(), key=lambda c: c.name),
                         [Change("pc", LOWERED), Change("shell", LOWERED)])
        self.assertEqual(self.registry({"shell"}).get("shell").risk, "low")    # allowed, after a restart

    def test_a_planted_user_skill_without_the_allow_list_stays_high_and_is_told(self):
        registry = self.registry()
        write(self.user, "shell", risk="Low", script="echo planted")
        registry.reload()
        self.assertEqual((registry.get("shell").risk, registry.get("shell").execute), ("high", "echo planted"))
        self.assertEqual(registry.take_changes(), [Change("shell", MODIFIED)])

    def test_added_and_changed_skills_are_told_once_each(self):
        registry = self.registry()
        write(self.user, "beta")
        registry.reload()
        self.assertEqual(registry.take_changes(), [Change("beta", ADDED)])
        registry.reload()
        self.assertEqual(registry.take_changes(), [])
        write(self.user, "beta", description="Another description.")   # not a told property
        registry.reload()
        self.assertEqual(registry.take_changes(), [])
        (self.user / "beta" / "SKILL.md").write_text(
            (self.user / "beta" / "SKILL.md").read_text() + "\n## Env\nHTTP_PROXY\n", encoding="utf-8")
        registry.reload()
        self.assertEqual(registry.take_changes(), [Change("beta", MODIFIED)])
        write(self.user, "alpha", risk="High")                          # raised: told, and High at once
        registry.reload()
        self.assertEqual((registry.get("alpha").risk, registry.take_changes()), ("high", [Change("alpha", MODIFIED)]))
        write(self.user, "alpha", risk="Low")
        registry.reload()
        self.assertEqual((registry.get("alpha").risk, registry.take_changes()), ("high", [Change("alpha", LOWERED)]))


class DaemonReloadTest(GateTestCase):
    """The agent, the gate and the daemon's watcher over a skills directory edited while they run."""

    async def asyncSetUp(self):
        self.user_dir = Path(tempfile.mkdtemp(prefix="ias-reload-"))
        shutil.copytree(FIXTURES / "gate", self.user_dir, dirs_exist_ok=True)
        self.user_skills = self.user_dir
        await super().asyncSetUp()
        self.model = ScriptedLLM()
        self.use(self.build(llm=self.model))

    async def asyncTearDown(self):
        await super().asyncTearDown()
        shutil.rmtree(self.user_dir, ignore_errors=True)
        self.model.assert_complete()

    def offered(self, request: int) -> list[str]:
        return [t["function"]["name"] for t in self.model.requests[request]["tools"]]

    async def test_a_skill_added_while_running_is_used_on_the_next_turn_and_a_broken_edit_keeps_it(self):
        self.model.script(answer("一"), ask(("greet", {})), answer("二"), ask(("greet", {})), answer("三"))
        await self.agent.turn("owner", "你好", None)
        self.assertNotIn("greet", self.offered(0))
        write(self.user_dir, "greet", script="echo hi from greet")
        self.assertEqual(await self.agent.turn("owner", "打个招呼", None), "二")
        self.assertIn("greet", self.offered(1))
        self.assertEqual(json.loads(self.model.requests[2]["messages"][-1]["content"]),
                         {"success": True, "output": "hi from greet\n"})
        write(self.user_dir, "greet", script="echo broken", broken=True)
        self.assertEqual(await self.agent.turn("owner", "再打个招呼", None), "三")
        self.assertEqual(json.loads(self.model.requests[4]["messages"][-1]["content"]),
                         {"success": True, "output": "hi from greet\n"})

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
        self.assertEqual([text for _, text in console.sent][1:], ["技能变更：late（新增）"])    # no outbox: the console
        self.assertIsNotNone(self.registry.get("echo_low"))     # its last good version

    async def test_a_lowered_skill_asks_for_the_code_and_the_owner_hears_once_through_tell(self):
        told: list[str] = []

        async def tell(text: str) -> None:
            told.append(text)
        console = FakeChannel("console")
        watcher = asyncio.create_task(watch_skills(self.registry, console, "owner", interval=0.01, tell=tell))
        try:
            write(self.user_dir, "mark_high", risk="Low", script='echo lowered >> "$IAS_PARAM_MARKER"')
            await asyncio.wait_for(self._until(lambda: told), 10)
            await asyncio.sleep(0.05)                                   # a few more scans: told once
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self.assertEqual(told, ["技能变更：mark_high（风险 High→Low 待重启生效）"])
        self.assertEqual(console.sent, [])
        task = self.call_high()
        await self.owner.code()                                         # still High: the code is asked for
        self.assertEqual(self.runs(), 0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _until(self, predicate) -> None:
        while not predicate():
            await asyncio.sleep(0.01)

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

    def test_a_skill_lowered_while_running_asks_for_the_code_until_a_restart(self):
        skills = self.tmp / "skills"
        shutil.copytree(FIXTURES / "gate", skills)
        marker = granted("marker")        # where mark_high's ## Sandbox lets it write
        proc = self.daemon(env={"IAS_SKILLS_DIR": str(skills)})
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running")
        path = skills / "mark_high" / "SKILL.md"
        path.write_text(path.read_text().replace("## Risk Level\nHigh", "## Risk Level\nLow"), encoding="utf-8")
        told = out.wait_for("技能变更：mark_high（风险 High→Low 待重启生效）")
        self.say(proc, '/run mark_high {"marker": "%s"}' % marker)
        out.wait_for("用户没有确认操作：mark_high", start=told + 1)        # still High (no terminal: no code)
        self.assertFalse(marker.exists())
        self.assertEqual(sum("技能变更" in line for line in out.lines), 1)
        proc.terminate()
        self.assertEqual(proc.wait(timeout=30), 0)
        proc = self.daemon(env={"IAS_SKILLS_DIR": str(skills)})         # the owner's restart: Low now
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running")
        self.say(proc, '/run mark_high {"marker": "%s"}' % marker)
        out.wait_for('"success": true')
        self.assertEqual(marker.read_text(), "none\n")
        self.assertFalse(any("技能变更" in line or "用户没有确认操作" in line for line in out.lines))
        proc.terminate()
        self.assertEqual(proc.wait(timeout=30), 0)

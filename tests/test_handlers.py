"""Built-in skills (`## Builtin`): the task skills and find_skills run in-process, through the same gate,
approval and audit; no database URL in any skill's environment and no process per call."""
import asyncio
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from ias.cron import TZ
from ias.errors import SkillError
from ias.handlers import HANDLERS, Handlers
from ias.registry import load_registry
from ias.skills import BUILTIN_NAMES, load_skill
from tests.support import REPO, GateTestCase

_spawned: list[str] = []
_watching = False


def _audit(event: str, args) -> None:
    if _watching and event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec"):
        _spawned.append(event)


sys.addaudithook(_audit)          # cannot be removed: it records only while `_watching` is set

ENV_SKILL = """# Print env

Prints its environment.

## Risk Level
Low

## Parameters
```json
{"type": "object", "properties": {}}
```

## Execute
```bash
env
```

## Env
IAS_DATABASE_URL IAS_DATA_DIR
"""


class TaskSkillsTest(GateTestCase):
    system_skills = REPO / "resources" / "skills"

    async def asyncSetUp(self):
        self.user_dir = Path(tempfile.mkdtemp(prefix="ias-builtin-"))
        (self.user_dir / "print_env").mkdir()
        (self.user_dir / "print_env" / "SKILL.md").write_text(ENV_SKILL, encoding="utf-8")
        self.user_skills = self.user_dir
        await super().asyncSetUp()

    async def asyncTearDown(self):
        await super().asyncTearDown()
        shutil.rmtree(self.user_dir, ignore_errors=True)

    def runner_environ(self):
        # What the daemon's own environment holds: the database URL must still reach no skill.
        return {"PATH": os.environ["PATH"], "IAS_DATABASE_URL": self.dsn}

    async def approved(self, name: str, params: dict) -> dict:
        call = asyncio.create_task(self.gate.call("owner", name, params, self.owner.notify))
        await self.approvals.redeem("owner", await self.owner.code())
        return await call

    async def test_manage_add_pause_delete_through_the_gate_with_no_process(self):
        global _watching
        slot = (datetime.now(TZ) + timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
        _watching = True
        try:
            added = await self.approved("manage_scheduled_task", {"action": "add", "name": "喝水", "schedule": slot,
                                                                  "text": "该喝水了"})
            self.assertTrue(added["success"], added)
            task_id = added["task"]["id"]
            self.assertEqual(added["task"]["next_runs"][0], slot + ":00")
            paused = await self.approved("manage_scheduled_task", {"action": "pause", "id": task_id})
            self.assertFalse(paused["task"]["enabled"])
            listed = await self.gate.call("owner", "list_scheduled_tasks", {"include_disabled": True})
            self.assertEqual([(t["name"], t["enabled"]) for t in listed["tasks"]], [("喝水", False)])
            self.assertEqual(await self.gate.call("owner", "list_scheduled_tasks", {}), {"success": True, "tasks": []})
            deleted = await self.approved("manage_scheduled_task", {"action": "delete", "id": task_id})
            self.assertEqual(deleted, {"success": True, "action": "delete", "task": {"removed": task_id}})
            missing = await self.approved("manage_scheduled_task", {"action": "resume", "id": task_id})
            self.assertEqual(missing, {"success": False, "error": f"no task with id {task_id}"})
        finally:
            _watching = False
        self.assertEqual(_spawned, [])
        self.assertEqual(self.sql("SELECT count(*) FROM scheduled_tasks"), [(0,)])
        # Same audit as any skill: started and finished rows, the approval decision.
        rows = self.sql("SELECT event, decision FROM audit_log WHERE skill_name = 'manage_scheduled_task' "
                        "AND event IN ('skill_started', 'skill_finished') ORDER BY id")
        self.assertEqual(rows, [("skill_started", "approved"), ("skill_finished", "approved")] * 4)

    async def test_invalid_parameters_are_refused_before_any_approval(self):
        result = await self.gate.call("owner", "manage_scheduled_task", {"action": "explode"}, self.owner.notify)
        self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.owner.messages, [])

    async def test_no_database_url_in_a_skill_environment_even_when_named_in_env(self):
        global _watching
        _watching, spawned = True, len(_spawned)
        try:
            result = await self.gate.call("owner", "print_env", {})
        finally:
            _watching = False
        self.assertGreater(len(_spawned), spawned)        # the audit hook does see a bash skill's process
        del _spawned[spawned:]
        self.assertTrue(result["success"], result)
        self.assertNotIn("IAS_DATABASE_URL", result["output"])
        self.assertNotIn(self.dsn, result["output"])
        self.assertIn("IAS_DATA_DIR=", result["output"])

    async def test_find_skills_names_matching_skills(self):
        result = await self.gate.call("owner", "find_skills", {"query": "scheduled tasks list", "limit": 2})
        self.assertTrue(result["success"], result)
        self.assertEqual(len(result["skills"]), 2)
        self.assertIn("list_scheduled_tasks", [s["name"] for s in result["skills"]])
        self.assertTrue(all("\n" not in s["description"] for s in result["skills"]))


class BuiltinSectionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-builtin-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def skill(self, name: str, tail: str) -> Path:
        (self.tmp / name).mkdir()
        (self.tmp / name / "SKILL.md").write_text(textwrap.dedent("""\
            # T

            Does a thing.

            ## Risk Level
            Low

            ## Parameters
            ```json
            {"type": "object", "properties": {"query": {"type": "string"}}}
            ```

            """) + tail, encoding="utf-8")
        return self.tmp / name

    def test_unknown_handler_is_a_load_error_with_its_line(self):
        with self.assertRaises(SkillError) as caught:
            load_skill(self.skill("bad", "## Builtin\nos.system\n"))
        self.assertEqual(len(caught.exception.problems), 1)
        self.assertRegex(caught.exception.problems[0], r"/bad/SKILL\.md:14: unknown built-in handler 'os\.system'")

    def test_both_execute_and_builtin_is_a_load_error(self):
        with self.assertRaises(SkillError) as caught:
            load_skill(self.skill("both", "## Builtin\ntasks.list\n\n## Execute\n```bash\necho\n```\n"))
        self.assertIn("either '## Execute' or '## Builtin'", caught.exception.problems[0])

    def test_a_user_skill_may_name_a_handler_and_override_a_builtin_one(self):
        self.skill("my_tasks", "## 内置\ntasks.list\n")
        self.skill("find_skills", "## Execute\n```bash\necho mine\n```\n")
        registry = load_registry(REPO / "resources" / "skills", self.tmp)
        self.assertEqual(registry.problems, ())
        self.assertEqual((registry.get("my_tasks").kind, registry.get("my_tasks").builtin), ("builtin", "tasks.list"))
        mine = registry.get("find_skills")
        self.assertEqual((mine.kind, mine.builtin, mine.execute, mine.overrides, mine.source),
                         ("script", None, "echo mine", True, "user"))

    def test_a_kind_without_its_field_is_refused(self):
        skill = load_skill(self.skill("mine", "## Builtin\ntasks.list\n"))
        for kind, builtin in (("script", "tasks.list"), ("builtin", None), ("mcp", "tasks.list"), ("shell", None)):
            with self.assertRaises(ValueError):
                replace(skill, kind=kind, builtin=builtin)


class VocabularyTest(unittest.TestCase):
    def test_the_grammar_names_exactly_the_handlers(self):
        self.assertEqual(set(HANDLERS), BUILTIN_NAMES)
        for method in HANDLERS.values():
            self.assertTrue(inspect.iscoroutinefunction(getattr(Handlers, method)), method)

    def test_parsing_a_skill_imports_no_executor(self):
        # The old circle: skills -> builtins -> registry/runner -> skills, hidden by a lazy import.
        code = ("import sys; from pathlib import Path; import ias.skills as s; "
                "s.load_skill(Path('resources/skills/find_skills')); "
                "print(' '.join(sorted(m for m in sys.modules if m.startswith('ias.'))))")
        loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
        modules = set(loaded.stdout.split())
        self.assertIn("ias.skills", modules)
        self.assertFalse(modules & {"ias.handlers", "ias.registry", "ias.runner", "ias.store"}, modules)


if __name__ == "__main__":
    unittest.main()

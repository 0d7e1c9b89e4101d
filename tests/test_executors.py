"""The executor contract (outcome.py), run against every executor: the script runner, the built-in
handlers and the MCP servers. Each returns one Outcome from run(skill, params, user) — success,
failure, timeout, output bounds — and that Outcome alone fills the `skill_finished` audit row,
with nothing made up for an executor it does not apply to (no exit code where no process ran)."""
import asyncio
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from ias.handlers import Handlers
from ias.limits import STDOUT_TO_LLM, TOOL_RESULT_MAX
from ias.outcome import Outcome
from ias.skills import Skill
from tests.support import REPO, GateTestCase, fixture_copy, granted

BIG = STDOUT_TO_LLM + 5000           # bytes of output a "big" call produces: more than the model may see


class ExecutorContract:
    """Mixed into a GateTestCase. A subclass sets `self.executor` and names, for each case, a
    (skill, params) the executor runs: `succeeding` (output containing "hello"), `failing`,
    `slow` (never ends by itself), `big` (BIG bytes of output)."""
    runs_a_process = False            # whether an exit code applies
    said = "hello"                    # what the succeeding call's result contains

    executor: object

    def succeeding(self) -> tuple[Skill, dict]:
        raise NotImplementedError

    def failing(self) -> tuple[Skill, dict]:
        raise NotImplementedError

    def slow(self) -> tuple[Skill, dict]:
        raise NotImplementedError

    def big(self) -> tuple[Skill, dict]:
        raise NotImplementedError

    async def outcome_of(self, case: tuple[Skill, dict]) -> Outcome:
        skill, params = case
        outcome = await asyncio.wait_for(self.executor.run(skill, params, "owner"), 30)
        self.assertIsInstance(outcome, Outcome)
        self.assertEqual(outcome.skill, skill.name)
        self.assertGreaterEqual(outcome.duration, 0.0)
        return outcome

    async def test_success(self):
        outcome = await self.outcome_of(self.succeeding())
        self.assertTrue(outcome.success, outcome.result)
        self.assertIn(self.said, json.dumps(outcome.result))
        self.assertGreater(outcome.output_size, 0)
        self.assertEqual((outcome.truncated, outcome.timed_out), (False, False))
        self.assertEqual(outcome.exit_code, 0 if self.runs_a_process else None)

    async def test_failure(self):
        outcome = await self.outcome_of(self.failing())
        self.assertFalse(outcome.success, outcome.result)
        self.assertIs(outcome.result["success"], False)
        self.assertIsInstance(outcome.result["error"], str)
        self.assertFalse(outcome.timed_out)
        if self.runs_a_process:
            self.assertNotIn(outcome.exit_code, (0, None))
        else:
            self.assertIsNone(outcome.exit_code)

    async def test_timeout(self):
        skill, params = self.slow()
        skill = replace(skill, timeout=0.5)
        started = asyncio.get_running_loop().time()
        outcome = await self.outcome_of((skill, params))
        self.assertLess(asyncio.get_running_loop().time() - started, 10)
        self.assertTrue(outcome.timed_out)
        self.assertEqual(outcome.result, {"success": False, "error": f"技能执行超时（0.5s）：{skill.name}"})
        if not self.runs_a_process:
            self.assertIsNone(outcome.exit_code)

    async def test_output_is_bounded_for_the_model(self):
        outcome = await self.outcome_of(self.big())
        self.assertTrue(outcome.truncated)
        self.assertIs(outcome.result.get("truncated"), True)
        self.assertGreaterEqual(outcome.output_size, BIG)
        self.assertLessEqual(len(json.dumps(outcome.result, ensure_ascii=False).encode()), STDOUT_TO_LLM + TOOL_RESULT_MAX)

    async def test_the_outcome_fills_the_audit_row(self):
        skill, params = self.succeeding()
        result = await self.gate.call("owner", skill.name, params)
        self.assertIs(result["success"], True, result)
        [row] = self.sql("SELECT decision, exit_code, output_size, truncated, duration_ms FROM audit_log "
                         "WHERE event = 'skill_finished' AND skill_name = %s", (skill.name,))
        decision, exit_code, output_size, truncated, duration_ms = row
        self.assertEqual((decision, truncated), ("auto", False))
        self.assertEqual(exit_code, 0 if self.runs_a_process else None)      # none made up where no process ran
        self.assertGreater(output_size, 0)
        self.assertIsNotNone(duration_ms)


SCRIPT = """# {name}

A contract test skill.

## Risk Level
Low

## Parameters
```json
{{"type": "object", "properties": {{}}}}
```

## Execute
```bash
{script}
```
"""

SCRIPTS = {"say_hello": "echo hello", "fail_loudly": "echo broken >&2; exit 3", "sleep_long": "sleep 30",
           "flood_out": f"head -c {BIG} /dev/zero | tr '\\0' a"}


class ScriptRunnerContract(ExecutorContract, GateTestCase):
    runs_a_process = True

    async def asyncSetUp(self):
        self.user_skills = Path(tempfile.mkdtemp(prefix="ias-contract-"))
        self.addCleanup(shutil.rmtree, self.user_skills, True)
        for name, script in SCRIPTS.items():
            (self.user_skills / name).mkdir()
            (self.user_skills / name / "SKILL.md").write_text(SCRIPT.format(name=name, script=script), encoding="utf-8")
        await super().asyncSetUp()
        self.executor = self.runner

    def case(self, name: str) -> tuple[Skill, dict]:
        skill = self.registry.get(name)
        self.assertEqual(skill.kind, "script")
        return skill, {}

    def succeeding(self):
        return self.case("say_hello")

    def failing(self):
        return self.case("fail_loudly")

    def slow(self):
        return self.case("sleep_long")

    def big(self):
        return self.case("flood_out")


class ContractHandlers(Handlers):
    """The real handlers, but find_skills can be asked to hang or to answer at length."""

    async def skills_find(self, params: dict, user_id: str) -> dict:
        if params.get("query") == "hang":
            await asyncio.sleep(60)
        if params.get("query") == "flood":
            return {"success": True, "skills": [{"name": "x", "description": "d" * BIG}]}
        return await super().skills_find(params, user_id)


class HandlersContract(ExecutorContract, GateTestCase):
    system_skills = REPO / "resources" / "skills"
    user_skills = None
    said = "find_skills"

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.executor = ContractHandlers(self.store, self.registry, lambda query, limit: ["find_skills"])

    def succeeding(self):
        skill = self.registry.get("find_skills")
        self.assertEqual(skill.kind, "builtin")
        return skill, {"query": "find a skill"}

    def failing(self):
        return self.registry.get("manage_scheduled_task"), {"action": "delete", "id": 987654}

    def slow(self):
        return self.registry.get("find_skills"), {"query": "hang"}

    def big(self):
        return self.registry.get("find_skills"), {"query": "flood"}


class McpContract(ExecutorContract, GateTestCase):
    async def asyncSetUp(self):
        self.user_skills = fixture_copy(self, "mcp")
        self.log = granted("events")
        await super().asyncSetUp()
        self.executor = self.app.mcp
        await self.app.mcp.check("demo")
        await self.app.mcp.check("picky")

    async def asyncTearDown(self):
        await self.app.mcp.close()
        await super().asyncTearDown()

    def succeeding(self):
        skill = self.registry.get("demo__echo")
        self.assertEqual(skill.kind, "mcp")
        return skill, {"text": "hello"}

    def failing(self):
        return self.registry.get("demo__fail"), {}

    def slow(self):
        return self.registry.get("picky__slow"), {}

    def big(self):
        return self.registry.get("demo__big"), {"size": BIG}


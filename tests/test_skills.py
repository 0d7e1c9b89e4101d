"""SKILL.md parsing (every error case), the registry's override rules and `ias skills`."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from ias.errors import SkillError
from ias.skills import load_registry, load_skill, parse_skill
from tests.support import FIXTURES, REPO

GOOD = """\
# Echo

Echo the text back.

## Risk Level
Low

## Parameters
```json
{
  "type": "object",
  "properties": {"text": {"type": "string"}},
  "required": ["text"]
}
```

## Execute
```bash
echo "$IAS_PARAM_TEXT"
```

## Timeout
12

## Env
ECHO_KEY, OTHER_KEY
"""


def parse(text: str, name: str = "echo"):
    return parse_skill(Path("/skills") / name / "SKILL.md", textwrap.dedent(text))


def problems(text: str, name: str = "echo") -> list[str]:
    try:
        parse(text, name)
    except SkillError as exc:
        return exc.problems
    raise AssertionError("expected a SkillError")


class ParseTest(unittest.TestCase):
    def test_good_skill(self):
        skill = parse(GOOD)
        self.assertEqual(skill.name, "echo")
        self.assertEqual(skill.title, "Echo")
        self.assertEqual(skill.description, "Echo the text back.")
        self.assertEqual(skill.risk, "low")
        self.assertEqual(skill.parameters["required"], ["text"])
        self.assertEqual(skill.execute, 'echo "$IAS_PARAM_TEXT"')
        self.assertEqual(skill.timeout, 12.0)
        self.assertEqual(skill.env, ("ECHO_KEY", "OTHER_KEY"))

    def test_defaults_and_case_insensitive_headings(self):
        text = GOOD.replace("## Risk Level", "## RISK level").replace("## Timeout\n12\n", "")
        skill = parse(text)
        self.assertEqual(skill.timeout, 30.0)
        self.assertEqual(skill.risk, "low")

    def test_chinese_headings(self):
        text = (GOOD.replace("## Risk Level\nLow", "## 风险等级\nHigh").replace("## Parameters", "## 参数")
                .replace("## Execute", "## 执行").replace("## Timeout", "## 超时").replace("## Env", "## 环境变量"))
        skill = parse(text)
        self.assertEqual((skill.risk, skill.timeout, skill.env), ("high", 12.0, ("ECHO_KEY", "OTHER_KEY")))

    def test_heading_inside_code_block_is_not_a_section(self):
        text = GOOD.replace('echo "$IAS_PARAM_TEXT"', 'cat <<X\n## Risk Level\nHigh\nX')
        skill = parse(text)
        self.assertEqual(skill.risk, "low")
        self.assertIn("## Risk Level", skill.execute)

    def test_unknown_sections_are_ignored(self):
        skill = parse(GOOD + "\n## Notes\nAnything here.\n")
        self.assertEqual(skill.name, "echo")

    def test_description_falls_back_to_title(self):
        skill = parse(GOOD.replace("Echo the text back.\n", ""))
        self.assertEqual(skill.description, "Echo")

    def test_missing_description(self):
        text = GOOD.replace("# Echo\n", "").replace("Echo the text back.\n", "")
        self.assertEqual(problems(text), ["/skills/echo/SKILL.md:1: missing description (the text before the first ## heading)"])

    def test_missing_required_sections(self):
        for heading in ("Risk Level", "Parameters", "Execute"):
            text = GOOD.replace(f"## {heading}", "## Something else")
            self.assertIn(f"/skills/echo/SKILL.md:1: missing required section '## {heading}'", problems(text))

    def test_unknown_risk(self):
        self.assertEqual(problems(GOOD.replace("Low", "Medium")),
                         ["/skills/echo/SKILL.md:6: unknown risk level 'Medium' (expected Low or High)"])

    def test_empty_risk(self):
        self.assertEqual(problems(GOOD.replace("Low\n", "\n")),
                         ["/skills/echo/SKILL.md:5: unknown risk level '' (expected Low or High)"])

    def test_invalid_json_points_at_the_line(self):
        text = GOOD.replace('"required": ["text"]', '"required": ["text"],')
        [problem] = problems(text)
        self.assertTrue(problem.startswith("/skills/echo/SKILL.md:14: invalid JSON in ## Parameters"), problem)

    def test_parameters_must_be_an_object_schema(self):
        text = GOOD.replace('"type": "object"', '"type": "array"')
        self.assertEqual(problems(text), ['/skills/echo/SKILL.md:10: ## Parameters must be a JSON Schema with "type": "object"'])

    def test_unsupported_schema_keyword(self):
        text = GOOD.replace('{"type": "string"}', '{"type": "string", "$ref": "#/x"}')
        [problem] = problems(text)
        self.assertTrue(problem.startswith("/skills/echo/SKILL.md:10: "), problem)
        self.assertIn("$ref", problem)

    def test_parameters_block_count(self):
        self.assertEqual(problems(GOOD.replace("```json", "```")),
                         ["/skills/echo/SKILL.md:8: '## Parameters' needs exactly one ```json block, found no"])
        two = GOOD.replace("## Execute", '```json\n{"type": "object"}\n```\n\n## Execute')
        self.assertEqual(problems(two), ["/skills/echo/SKILL.md:8: '## Parameters' needs exactly one ```json block, found 2"])

    def test_execute_block(self):
        self.assertEqual(problems(GOOD.replace("```bash", "```python")),
                         ["/skills/echo/SKILL.md:17: '## Execute' needs exactly one ```bash block, found no"])
        self.assertEqual(problems(GOOD.replace('echo "$IAS_PARAM_TEXT"', "   ")),
                         ["/skills/echo/SKILL.md:19: ## Execute block is empty"])

    def test_timeout(self):
        for bad in ("0", "601", "ten", "1.5", "30 minutes"):
            self.assertEqual(problems(GOOD.replace("\n12\n", f"\n{bad}\n")),
                             [f"/skills/echo/SKILL.md:23: timeout must be whole seconds from 1 to 600, got '{bad}'"])
        self.assertEqual(parse(GOOD.replace("\n12\n", "\n600s\n")).timeout, 600.0)

    def test_env_names(self):
        self.assertEqual(problems(GOOD.replace("ECHO_KEY,", "ECHO-KEY,")),
                         ["/skills/echo/SKILL.md:26: 'ECHO-KEY' is not an environment variable name"])
        for reserved in ("PATH", "HOME", "IAS_PARAMS", "IAS_PARAM_TEXT"):
            self.assertEqual(problems(GOOD.replace("ECHO_KEY,", f"{reserved},")),
                             [f"/skills/echo/SKILL.md:26: '{reserved}' is set by the runner and cannot be passed through"])

    def test_skill_name_from_directory(self):
        self.assertEqual(problems(GOOD, "Bad-Name"),
                         ["/skills/Bad-Name/SKILL.md:1: skill name 'Bad-Name' (the directory name) must match ^[a-z][a-z0-9_]{0,63}$"])
        self.assertTrue(problems(GOOD, "a" * 65))

    def test_duplicate_section(self):
        text = GOOD + "\n## Risk Level\nHigh\n"
        self.assertEqual(problems(text), ["/skills/echo/SKILL.md:28: duplicate section '## Risk Level' (first at line 5)"])

    def test_unclosed_fence(self):
        text = GOOD.replace("## Timeout\n12\n\n## Env\nECHO_KEY, OTHER_KEY\n", "```\nnever closed\n")
        self.assertIn("/skills/echo/SKILL.md:22: unclosed code fence", problems(text))

    def test_every_problem_is_reported(self):
        text = "# X\n\nd\n\n## Risk Level\nmaybe\n\n## Timeout\n0\n"
        self.assertEqual(len(problems(text)), 4)       # parameters, execute, risk, timeout

    def test_unreadable_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            skill_dir = Path(tmp) / "gone"
            skill_dir.mkdir()
            with self.assertRaises(SkillError) as caught:
                load_skill(skill_dir)
            self.assertIn("SKILL.md:1: cannot read", caught.exception.problems[0])


class RegistryTest(unittest.TestCase):
    def setUp(self):
        self.system = FIXTURES / "registry" / "system"
        self.user = FIXTURES / "registry" / "user"

    def test_override_and_risk_floor(self):
        reg = load_registry(self.system, self.user)
        shared = reg.get("shared_high")
        self.assertEqual((shared.source, shared.overrides, shared.risk), ("user", True, "high"))
        self.assertIn("echo user", shared.execute)
        [warning] = reg.warnings
        self.assertIn("shared_high/SKILL.md:1: user skill 'shared_high' may not lower the risk", warning)

    def test_downgrade_allowed_by_config(self):
        reg = load_registry(self.system, self.user, allow_risk_downgrade={"shared_high"})
        self.assertEqual(reg.get("shared_high").risk, "low")
        self.assertEqual(reg.warnings, ())

    def test_one_bad_skill_never_stops_the_others(self):
        reg = load_registry(self.system, self.user)
        self.assertEqual([s.name for s in reg], ["extra", "plain", "shared_high"])
        # The broken user override of `plain` is reported and the system skill stays.
        self.assertEqual(reg.get("plain").source, "system")
        self.assertFalse(reg.get("plain").overrides)
        [problem] = reg.problems
        self.assertRegex(problem, r"user/plain/SKILL\.md:4: unknown risk level 'Medium'")

    def test_chinese_user_skill(self):
        extra = load_registry(None, self.user).get("extra")
        self.assertEqual((extra.risk, extra.timeout, extra.env, extra.title), ("low", 7.0, ("EXTRA_TOKEN",), "额外技能"))

    def test_missing_directories_are_empty(self):
        self.assertEqual(len(load_registry(Path("/nonexistent/a"), Path("/nonexistent/b"))), 0)


def ias(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO, timeout=60)


class CliTest(unittest.TestCase):
    def test_shipped_skills_check_clean(self):
        result = ias("skills", "check", env={"IAS_SKILLS_DIR": str(REPO / "skills")})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_check_reports_path_and_line(self):
        result = ias("skills", "check", env={"IAS_SKILLS_DIR": str(FIXTURES / "registry" / "user")})
        self.assertEqual(result.returncode, 1)
        self.assertRegex(result.stdout, r"(?m)^\S*registry/user/plain/SKILL\.md:4: unknown risk level 'Medium'")

    def test_skills_json(self):
        result = ias("skills", "--json", env={"IAS_SKILLS_DIR": str(FIXTURES / "registry" / "user")})
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {r["name"]: r for r in json.loads(result.stdout)}
        self.assertEqual(rows["get_current_datetime"]["source"], "system")
        self.assertEqual(rows["extra"], {"name": "extra", "source": "user", "risk": "low", "timeout": 7.0,
                                         "overrides": False, "description": "用中文标题写的用户技能。"})

    def test_skills_show(self):
        result = ias("skills", "show", "get_current_datetime")
        spec = json.loads(result.stdout)
        self.assertEqual(spec["parameters"]["properties"]["format"]["enum"], ["full", "date", "time"])
        self.assertEqual(ias("skills", "show", "nope").returncode, 1)

    def test_listing_does_not_import_openai_or_psycopg(self):
        code = ("import sys; from ias.cli import main; main(['skills']); "
                "print('openai' in sys.modules, 'psycopg' in sys.modules)")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
        self.assertTrue(result.stdout.strip().endswith("False False"), result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main()

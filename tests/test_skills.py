"""SKILL.md parsing (every error case), the registry's override rules and `ias skills`."""
import json
import os
import re
import subprocess
import sys
import tempfile
import shutil
import signal
import textwrap
import time
import unittest
from pathlib import Path
from unittest import mock

from ias.errors import SkillError
from ias.jsonschema import validator as validator_module
from ias.limits import SKILL_FILE_MAX
from ias.registry import load_registry
from ias.skills import load_skill, parse_skill
from tests.servers.llm import LLMServer, calls, text
from tests.support import FIXTURES, REPO, GateTestCase, drop_schema, fresh_schema_dsn, slow

HOSTILE = FIXTURES / "hostile"
# Every broken SKILL.md under tests/fixtures/hostile, with the line and message it must get.
BROKEN = {
    "deep_array": ":10: invalid JSON in ## Parameters: nested deeper than 64 levels",
    "deep_not": ":10: invalid JSON in ## Parameters: nested deeper than 64 levels",
    "json_digits": ":10: invalid JSON in ## Parameters: number with more than 100 digits",
    "minimum_huge": ":10: invalid JSON in ## Parameters: number with more than 100 digits",
    "redos": ":10: $.properties.s.pattern: prone to catastrophic backtracking",
    "overlapping": ":10: $.properties.s.pattern: prone to catastrophic backtracking",
    "timeout_digits": ":19: timeout must be whole seconds from 1 to 600, got '9999",
    "oversized": ":1: SKILL.md is larger than 256 KiB",
}


def hostile_dir(tmp: Path) -> Path:
    """The hostile fixtures plus a SKILL.md over the size limit (made here, not kept in git)."""
    root = tmp / "skills"
    shutil.copytree(HOSTILE, root)
    (root / "oversized").mkdir()
    good = (HOSTILE / "echo_good" / "SKILL.md").read_text(encoding="utf-8")
    (root / "oversized" / "SKILL.md").write_text(good + "x" * SKILL_FILE_MAX, encoding="utf-8")
    return root

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
        for reserved in ("PATH", "HOME", "IAS_PARAMS", "IAS_PARAM_TEXT", "PYTHONPATH"):
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


class HostileParseTest(unittest.TestCase):
    """CommonMark as written by editors, and files written to break the loader."""

    def test_commonmark_skill(self):
        skill = load_skill(HOSTILE / "echo_good")
        self.assertEqual((skill.title, skill.risk, skill.timeout), ("Echo good", "low", 5.0))
        self.assertTrue(skill.description.startswith("Echoes its text.\fA form feed"), skill.description)
        self.assertEqual(skill.parameters["required"], ["text"])
        self.assertEqual(skill.execute, "printf '{\"success\": true, \"echo\": \"%s\"}' \"$IAS_PARAM_TEXT\"")

    def test_bom_keeps_the_title(self):
        skill = parse("\ufeff" + GOOD)
        self.assertEqual((skill.title, skill.description), ("Echo", "Echo the text back."))

    def test_headings_and_fences_as_commonmark_defines_them(self):
        text = (GOOD.replace("## Risk Level", "   ##\tRisk Level  ##").replace("## Parameters", " ## Parameters")
                .replace("```json", "```json title=\"p\"").replace("```bash", "~~~~ bash {.x}")
                .replace('echo "$IAS_PARAM_TEXT"\n```', 'echo "$IAS_PARAM_TEXT"\n```\n~~~~~'))
        skill = parse(text)
        self.assertEqual((skill.risk, skill.parameters["required"]), ("low", ["text"]))
        self.assertEqual(skill.execute, 'echo "$IAS_PARAM_TEXT"\n```')
        # Four spaces of indent make neither a heading nor a fence; `#x` is no heading either.
        self.assertIn("missing required section '## Risk Level'",
                      " ".join(problems(GOOD.replace("## Risk Level", "    ## Risk Level"))))
        self.assertEqual(parse(GOOD.replace("# Echo", "#Echo")).title, "echo")

    def test_fence_content_loses_the_fence_indent(self):
        skill = parse(GOOD.replace("```bash\necho", "  ```bash\n   echo").replace('TEXT"\n```', 'TEXT"\n  ```'))
        self.assertEqual(skill.execute, ' echo "$IAS_PARAM_TEXT"')

    def test_line_numbers_count_newlines_only(self):
        for odd in ("\f", "\v", "\x85", "\u2028", "\u2029", "\x1c", "\r"):
            with self.subTest(odd=repr(odd)):
                text = GOOD.replace("Echo the text back.", f"Echo{odd}the{odd}text back.").replace("Low", "Medium")
                self.assertEqual(problems(text), ["/skills/echo/SKILL.md:6: unknown risk level 'Medium' (expected Low or High)"])

    def test_crlf_line_endings(self):
        skill = parse(GOOD.replace("\n", "\r\n"))
        self.assertEqual((skill.risk, skill.timeout, skill.execute), ("low", 12.0, 'echo "$IAS_PARAM_TEXT"'))

    def test_huge_timeout_is_a_short_problem(self):
        [problem] = problems(GOOD.replace("\n12\n", "\n" + "9" * 5000 + "\n"))
        self.assertLess(len(problem), 200)
        self.assertIn(":23: timeout must be whole seconds from 1 to 600", problem)

    def test_hostile_json(self):
        cases = {
            '"maximum": ' + "9" * 5000: "number with more than 100 digits",
            '"minimum": 1' + "0" * 400: "number with more than 100 digits",
            '"minimum": 1e400': "number out of range",
            '"minimum": NaN': "NaN is not a JSON number",
            '"examples": ' + "[" * 100000 + "]" * 100000: "nested deeper than 64 levels",
        }
        for fragment, message in cases.items():
            with self.subTest(message=message):
                text = GOOD.replace('"required": ["text"]', '"required": ["text"], ' + fragment)
                [problem] = problems(text)
                self.assertRegex(problem, rf"^/skills/echo/SKILL\.md:1[0-4]: invalid JSON in ## Parameters: {message}")
        nested = '{"not": ' * 500 + "{}" + "}" * 500
        [problem] = problems(GOOD.replace('{"type": "string"}', nested))
        self.assertIn("nested deeper than 64 levels", problem)

    def test_any_failure_is_that_skills_problem(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("one", "two"):
                (Path(tmp) / name).mkdir()
                (Path(tmp) / name / "SKILL.md").write_text(GOOD, encoding="utf-8")
            real_compile = __import__("ias.jsonschema", fromlist=["compile"]).compile

            def compile(schema):       # the first skill's schema fails as no schema should
                if not calls_seen:
                    calls_seen.append(schema)
                    raise MemoryError("out of memory")
                return real_compile(schema)
            calls_seen: list = []
            with mock.patch("ias.jsonschema.compile", compile):
                reg = load_registry(None, Path(tmp))
        self.assertEqual([s.name for s in reg], ["two"])
        [problem] = reg.problems
        self.assertRegex(problem, r"one/SKILL\.md:1: cannot load: MemoryError: out of memory$")

    def test_oversized_and_undecodable_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "big"
            big.mkdir()
            (big / "SKILL.md").write_bytes(GOOD.encode() + b" " * SKILL_FILE_MAX)
            with self.assertRaises(SkillError) as caught:
                load_skill(big)
            self.assertEqual(caught.exception.problems, [f"{big}/SKILL.md:1: SKILL.md is larger than 256 KiB"])
            (big / "SKILL.md").write_bytes(GOOD.encode().replace(b"Low", b"L\xffow"))
            with self.assertRaises(SkillError) as caught:
                load_skill(big)
            self.assertEqual(caught.exception.problems, [f"{big}/SKILL.md:6: not UTF-8 (byte 44)"])

    def test_high_parameters_without_title_warn(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, title in (("untitled", ""), ("titled", '"title": "文本", ')):
                (Path(tmp) / name).mkdir()
                text = GOOD.replace("Low", "High").replace('{"type": "string"}', "{" + title + '"type": "string"}')
                (Path(tmp) / name / "SKILL.md").write_text(text, encoding="utf-8")
            reg = load_registry(None, Path(tmp))
            self.assertEqual(len(reg), 2)
            self.assertEqual(reg.warnings, (f"{Path(tmp).resolve()}/untitled/SKILL.md:10: High skill parameters "
                                            "without a title (their label in the approval message): text",))
            result = ias("skills", "check", env={"IAS_SKILLS_DIR": tmp})
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn("untitled/SKILL.md:10: High skill parameters without a title", result.stdout)


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


class CompiledAtLoadTest(GateTestCase):
    """Each skill's validator is built once, when the registry loads: a call compiles nothing."""

    async def test_the_gate_validates_with_the_validator_built_at_load(self):
        skill = self.registry.get("echo_low")
        self.assertEqual(skill.validator({"text": 1}), ["$.text: expected string, got integer"])
        refuse = AssertionError("a schema was compiled during a call")
        with mock.patch("ias.jsonschema.compile", side_effect=refuse), mock.patch("ias.jsonschema.validator.build", side_effect=refuse):
            self.assertEqual(await self.gate.call("owner", "echo_low", {"text": 1}),
                             {"success": False, "error": "参数错误：$.text: expected string, got integer"})
            self.assertEqual(await self.gate.call("owner", "echo_low", {}), {"success": True, "output": "hi"})

    def test_a_skill_whose_schema_does_not_compile_is_not_loaded(self):
        text = GOOD.replace('{"type": "string"}', '{"type": "string", "minLength": -1}')
        self.assertEqual(problems(text), ["/skills/echo/SKILL.md:10: $.properties.text.minLength: must be a non-negative integer"])


class CompiledAtFirstUseTest(unittest.TestCase):
    """The listing's parse (`lazy`) checks each schema as the load does, and compiles it only when first used."""

    def lazy(self, text: str):
        return parse_skill(Path("/skills/echo/SKILL.md"), textwrap.dedent(text), lazy=True)

    def test_nothing_is_compiled_until_the_first_call_then_once(self):
        with mock.patch("ias.jsonschema.validator.build", wraps=validator_module.build) as build:
            skill = self.lazy(GOOD)
            self.assertEqual(build.call_count, 0)
            self.assertEqual(skill.validator({"text": 1}), ["$.text: expected string, got integer"])
            self.assertEqual(skill.validator({"text": "hi"}), [])
            self.assertEqual(build.call_count, 1)
        self.assertEqual(skill, parse(GOOD))          # the same skill as the load's, validator aside

    def test_a_bad_schema_is_the_same_problem(self):
        text = GOOD.replace('{"type": "string"}', '{"type": "string", "minLength": -1}')
        with self.assertRaises(SkillError) as caught:
            self.lazy(text)
        self.assertEqual(caught.exception.problems, problems(text))


@slow
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
                                         "overrides": False, "description": "用中文标题写的用户技能。",
                                         "sandbox": "default"})

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


class HostileDirectoryTest(unittest.TestCase):
    """Every broken SKILL.md at once, next to one good skill: each command still works."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-hostile-"))
        self.skills = hostile_dir(self.tmp)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_registry_loads_the_good_skill(self):
        reg = load_registry(None, self.skills)
        self.assertEqual([s.name for s in reg], ["echo_good"])
        self.assertEqual(len(reg.problems), len(BROKEN))
        for name, message in BROKEN.items():
            self.assertTrue(any(p.startswith(f"{self.skills}/{name}/SKILL.md{message}") for p in reg.problems),
                            (name, reg.problems))

    @slow
    def test_skills_and_skills_check(self):
        result = ias("skills", "check", env={"IAS_SKILLS_DIR": str(self.skills)})
        self.assertEqual(result.returncode, 1, result.stderr)
        for name, message in BROKEN.items():
            self.assertRegex(result.stdout, rf"(?m)^{self.skills}/{name}/SKILL\.md{re.escape(message)}")
        self.assertLess(max(map(len, result.stdout.splitlines())), 400)
        listing = ias("skills", "--json", env={"IAS_SKILLS_DIR": str(self.skills)})
        self.assertEqual(listing.returncode, 0, listing.stderr)
        self.assertIn("echo_good", [row["name"] for row in json.loads(listing.stdout)])


@slow
class HostileDirectoryDaemonTest(unittest.TestCase):
    """`run`, `--once` and the daemon with the hostile directory: real processes, real PostgreSQL."""

    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-hostile-"))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_"))}
        self.env.update({"IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp / "var"),
                         "IAS_SKILLS_DIR": str(hostile_dir(self.tmp)), "OPENAI_API_KEY": "sk-never-visible"})

    def tearDown(self):
        drop_schema(self.schema_name)
        shutil.rmtree(self.tmp)

    def ias(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, cwd=self.tmp, timeout=60, stdin=subprocess.DEVNULL)

    def test_run(self):
        result = self.ias("run", "echo_good", '{"text": "hi"}')
        self.assertEqual((result.returncode, json.loads(result.stdout)), (0, {"success": True, "echo": "hi"}),
                         result.stderr)
        # Arguments nested too deep are refused before parsing, and nothing runs.
        for deep in ('{"text": ' + "[" * 500 + "]" * 500 + "}", "[" * 100000):
            result = self.ias("run", "echo_good", deep)
            self.assertEqual((result.returncode, result.stdout), (2, ""), result.stderr)
            self.assertEqual(result.stderr, "ias: parameters are not valid JSON: nested deeper than 64 levels\n")

    def test_once_with_the_good_skill_and_deep_arguments(self):
        deep = '{"text": ' + "[" * 10000 + "]" * 10000 + "}"      # within 64 KiB: longer is refused unparsed
        with LLMServer([calls(("echo_good", {"text": "hi"}), ("echo_good", deep)), text("好了")]) as server:
            result = self.ias("--once", "回声", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url})
        self.assertEqual((result.returncode, result.stdout), (0, "好了\n"), result.stderr)
        results = [json.loads(m["content"]) for m in server.requests[1]["messages"] if m["role"] == "tool"]
        self.assertEqual(results[0], {"success": True, "echo": "hi"})
        self.assertEqual(results[1]["success"], False)
        self.assertTrue(results[1]["error"].startswith("参数错误：$: arguments are not valid JSON (nested deeper than 64"),
                        results[1])

    def test_daemon(self):
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py")], env=self.env, cwd=self.tmp, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            proc.stdin.write('/run echo_good {"text": "daemon"}\n')
            proc.stdin.flush()
            line = ""
            deadline = time.monotonic() + 30
            while "daemon" not in line and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
            self.assertIn('"echo": "daemon"', line)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
            self.assertEqual(proc.returncode, 0)
            self.assertIn("skill not loaded", proc.stderr.read())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()


if __name__ == "__main__":
    unittest.main()

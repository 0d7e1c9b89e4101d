"""`ias run`, `ias approvals` and `ias audit` as a user runs them: real processes, real PostgreSQL;
and that the command-line modules build nothing themselves."""
import ast
import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from tests.support import FIXTURES, REPO, drop_schema, fresh_schema_dsn, granted, slow


def constructed(path: Path) -> set[str]:
    """The classes a module calls directly or through a class method (`Store.open`): capitalized callees."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func.value if isinstance(node.func, ast.Attribute) else node.func
            if isinstance(func, ast.Name) and func.id[:1].isupper():
                names.add(func.id)
    return names


class BuildsNothingTest(unittest.TestCase):
    def test_the_command_line_gets_every_object_from_app(self):
        """cli, commands and doctor construct none of the classes app builds (Catalog, Runner, Servers once were)."""
        built = constructed(REPO / "ias" / "app.py")
        self.assertTrue({"Catalog", "Runner", "Servers", "Store", "Gate"} <= built, built)
        for name in ("cli", "commands", "doctor", "backup"):
            with self.subTest(module=name):
                self.assertEqual(constructed(REPO / "ias" / f"{name}.py") & built, set())


@slow
class CliTestCase(unittest.TestCase):
    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-cli-"))
        self.env = {**os.environ, "IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp),
                    "IAS_SKILLS_DIR": str(FIXTURES / "gate"), "OPENAI_API_KEY": "sk-never-visible"}
        self.env.pop("IAS_CONFIG", None)

    def tearDown(self):
        drop_schema(self.schema_name)
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def ias(self, *args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              env=self.env, cwd=self.tmp, timeout=60, stdin=stdin)


class RunTest(CliTestCase):
    def test_low_skill(self):
        result = self.ias("run", "get_current_datetime", '{"format":"date"}')
        self.assertEqual(result.returncode, 0, result.stderr)
        out = json.loads(result.stdout)
        self.assertTrue(out["success"])
        self.assertRegex(out["datetime"], r"^\d{4}-\d{2}-\d{2} 星期.$")

    def test_run_does_not_import_openai(self):
        """Commands that need no model never import it (cold start), even with OPENAI_API_KEY set."""
        probe = ("import sys; from ias import cli; code = cli.main(['run', 'echo_low', '{\"text\": \"hi\"}']); "
                 "print(code, 'openai' in sys.modules)")
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                env={**self.env, "PYTHONPATH": str(REPO)}, cwd=self.tmp, timeout=60)
        self.assertEqual(result.stdout.splitlines()[-1], "0 False", result.stderr)

    def test_errors(self):
        result = self.ias("run", "nope")
        self.assertEqual((result.returncode, json.loads(result.stdout)), (1, {"success": False, "error": "未知技能：nope"}))
        result = self.ias("run", "get_current_datetime", '{"format": 1}')
        self.assertEqual(result.returncode, 1)
        self.assertTrue(json.loads(result.stdout)["error"].startswith("参数错误：$.format"))
        self.assertEqual(self.ias("run", "get_current_datetime", "{oops").returncode, 2)

    def test_high_skill_without_terminal_is_not_confirmed(self):
        marker = granted("marker")
        result = self.ias("run", "mark_high", json.dumps({"marker": str(marker)}))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(json.loads(result.stdout), {"success": False, "error": "用户没有确认操作：mark_high"})
        self.assertIn("标准输入不是终端", result.stderr)
        self.assertFalse(marker.exists())

    def test_high_skill_confirmed_on_the_terminal(self):
        marker = granted("marker")
        out, code = self.confirm_on_terminal(marker)
        self.assertEqual(json.loads(out), {"success": True, "note": "typed"})
        self.assertEqual(marker.read_text(), "typed\n")

        approvals = self.ias("approvals", "--all")
        self.assertRegex(approvals.stdout, r"approved\s+owner\s+mark_high")
        self.assertNotIn(code, approvals.stdout)
        self.assertEqual(self.ias("approvals").stdout.strip(), "no pending approvals")
        audit = self.ias("audit", "--limit", "50")
        for event in ("approval_requested", "approval_approved", "skill_started", "skill_finished"):
            self.assertIn(event, audit.stdout)
        self.assertNotIn(code, audit.stdout)
        verify = self.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)

    def test_invalid_utf8_typed_at_the_prompt(self):
        """The terminal's console survives bytes that are not UTF-8, and the code still works."""
        marker = granted("marker")
        out, _ = self.confirm_on_terminal(marker, junk=b"\xff\xfe \xe4\xbd\n")
        self.assertEqual(json.loads(out), {"success": True, "note": "typed"})
        self.assertEqual(marker.read_text(), "typed\n")

    def confirm_on_terminal(self, marker: Path, junk: bytes = b"") -> tuple[bytes, str]:
        """`run mark_high` on a pty: type `junk` (answered with a hint), then the code; (stdout, code)."""
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py"), "run", "mark_high",
                                 json.dumps({"marker": str(marker), "note": "typed"})],
                                stdin=slave, stderr=slave, stdout=subprocess.PIPE, env=self.env, cwd=self.tmp)
        os.close(slave)
        try:
            text = read_until(master, "分钟内有效").decode()
            self.assertIn("⚠️ 操作确认", text)
            self.assertIn("· note：typed", text)
            code = re.search(r"确认码：(\d{6})", text).group(1)
            if junk:
                os.write(master, junk)
                self.assertIn("请回复 6 位确认码".encode(), read_until(master, "请回复 6 位确认码"))
            os.write(master, code.encode() + b"\n")
            out, _ = proc.communicate(timeout=30)
        finally:
            proc.kill()
            os.close(master)
        return out, code


def read_until(fd: int, needle: str, timeout: float = 30) -> bytes:
    """What a pty shows until `needle` appears (or the timeout passes)."""
    screen = b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in screen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            screen += os.read(fd, 4096)
    return screen


class AuditCommandTest(CliTestCase):
    def test_verify_fails_after_tampering(self):
        self.ias("run", "echo_low", '{"text": "a"}')
        self.assertEqual(self.ias("audit", "--verify").returncode, 0)
        import psycopg
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
            conn.execute("UPDATE audit_log SET exit_code = 1 WHERE event = 'skill_finished'")
        verify = self.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 1)
        self.assertIn("row altered", verify.stdout)


class BadInputTest(CliTestCase):
    """No command-line input gives a traceback: one line on stderr, exit 2 for usage errors, else 1."""

    def assert_one_line(self, result: subprocess.CompletedProcess, code: int, needle: str) -> None:
        self.assertEqual(result.returncode, code, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertNotIn("internal error", result.stderr)     # a known case is handled where it happens
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
        self.assertIn(needle, result.stderr)

    def test_usage_errors(self):
        for args, needle in [(["audit", "--limit", "-1"], "--limit: must be between 0 and"),
                             (["audit", "--limit", "99999999999999999999"], "--limit: must be between 0 and"),
                             (["audit", "--limit", "9" * 5000], "--limit: not a whole number"),
                             (["audit", "--limit", "ten"], "--limit: not a whole number"),
                             (["tasks", "remove", "99999999999999999999"], "id: must be between 0 and"),
                             (["nosuchcommand"], "invalid choice"),
                             (["run"], "required: name")]:
            with self.subTest(args=args[:3]):
                self.assert_one_line(self.ias(*args), 2, needle)

    def test_unusable_json_parameters(self):
        for params, needle in [("[" * 100_000, "nested deeper than 64 levels"),
                               ('{"format": ' + "9" * 5000 + "}", "number with more than 100 digits"),
                               ("{oops", "not valid JSON")]:
            with self.subTest(params=params[:20]):
                self.assert_one_line(self.ias("run", "get_current_datetime", params), 2, needle)
        # The same text in a /run message (as from WeChat or the model) is an invalid call, not a crash;
        # past 64 KiB it is refused before it is even parsed.
        for params, error in [("[" * 10_000, "参数错误：$: arguments are not valid JSON (nested deeper than 64 levels)"),
                              ('{"n": ' + "9" * 5000 + "}",
                               "参数错误：$: arguments are not valid JSON (number with more than 100 digits)"),
                              ("[" * 100_000, "参数过长：get_current_datetime")]:
            once = self.ias("--once", f"/run get_current_datetime {params}")
            self.assertEqual((once.returncode, once.stderr), (0, ""))
            self.assertEqual(json.loads(once.stdout)["error"], error)
        deep = self.ias("run", "get_current_datetime", "[" * 600 + "]" * 600)     # well-formed, but deeper than allowed
        self.assert_one_line(deep, 2, "nested deeper than 64 levels")

    def test_bad_mail_settings(self):
        self.env.update(IAS_NOTIFY_EMAIL="me@example.com", IAS_SMTP_HOST="smtp.qq.com", IAS_SMTP_PORT="abc")
        self.assert_one_line(self.ias("doctor"), 1, "IAS_SMTP_PORT must be a port number")
        self.env.update(IAS_SMTP_PORT="465", IAS_SMTP_SSL="tls")
        self.assert_one_line(self.ias("--once", "/help"), 1, "IAS_SMTP_SSL must be ssl, starttls or none")

    def test_junk_database_url(self):
        for url, needle in [("junk", 'invalid database connection string: missing "=" after "junk"'),
                            ("postgresql://[::1", "invalid database connection string"),
                            ("host=/tmp/\udcff", "IAS_DATABASE_URL is not valid UTF-8"),
                            ("host=/nonexistent", "cannot connect to PostgreSQL")]:
            with self.subTest(url=url):
                self.env["IAS_DATABASE_URL"] = url
                self.assert_one_line(self.ias("audit"), 1, needle)

    def test_junk_config_and_environment(self):
        (self.tmp / "a-file").write_text("")
        (self.tmp / "latin1.toml").write_bytes(b'model = "caf\xe9"\n')
        (self.tmp / "deep.toml").write_text("model = " + "[" * 100_000)
        (self.tmp / "bad.toml").write_text("model = \n")
        for args, env, needle in [(["--config", "missing.toml"], {}, "cannot read config"),
                                  (["--config", "latin1.toml"], {}, "not UTF-8"),
                                  (["--config", "deep.toml"], {}, "nested too deeply"),
                                  (["--config", "bad.toml"], {}, "bad.toml"),
                                  (["--config", "\udcff.toml"], {}, "cannot read config"),
                                  ([], {"IAS_APPROVAL_TIMEOUT": "soon"}, "IAS_APPROVAL_TIMEOUT"),
                                  ([], {"IAS_APPROVAL_TIMEOUT": "nan"}, "IAS_APPROVAL_TIMEOUT"),
                                  ([], {"IAS_MODEL": "caf\udce9"}, "IAS_MODEL is not valid UTF-8"),
                                  ([], {"IAS_DATA_DIR": "a-file"}, "is not a directory"),
                                  ([], {"OPENAI_API_KEY": "sk-\udcff"}, "OPENAI_API_KEY is not valid UTF-8")]:
            with self.subTest(args=args, env=env):
                self.env.update(env)
                self.assert_one_line(self.ias(*args, "run", "get_current_datetime"), 1, needle)
                for name in env:
                    del self.env[name]

    def test_invalid_utf8_arguments(self):
        """Arguments that are not UTF-8 are read with replacement characters, stored and printed."""
        result = self.ias("run", "\udcff\udcfe", "{}")          # the bytes ff fe on the command line
        self.assertEqual((result.returncode, result.stderr), (1, ""))
        self.assertEqual(json.loads(result.stdout), {"success": False, "error": "未知技能：\ufffd\ufffd"})
        result = self.ias("run", "get_current_datetime", '{"format": "\udcff"}')
        self.assertEqual(result.returncode, 1)
        self.assertTrue(json.loads(result.stdout)["error"].startswith("参数错误：$.format"))
        added = self.ias("tasks", "add", "--name", "n\udcff", "--schedule", "every 1h", "--text", "t\udce4\udcbd")
        self.assertEqual(added.returncode, 0, added.stderr)
        listed = self.ias("tasks", "list", "--json")
        [task] = json.loads(listed.stdout)
        self.assertEqual((task["name"], task["text"]), ("n\ufffd", "t\ufffd"))
        audit = self.ias("audit")
        self.assertIn("skill=\ufffd\ufffd", audit.stdout)
        self.assertEqual(self.ias("audit", "--verify").returncode, 0)

    def test_bad_task_requests(self):
        self.assertEqual(self.ias("tasks", "add", "--name", "n", "--schedule", "every 1h", "--text", "t").returncode, 0)
        for args, needle in [(["update", "1", "--schedule", "every 1x"], "bad interval"),
                             (["update", "1", "--schedule", "2026-02-30 08:00"], "day is out of range"),
                             (["update", "7", "--text", "x"], "no task with id 7"),
                             (["add", "--name", "n", "--schedule", "*/0 * * * *", "--text", "t"], "step must be")]:
            with self.subTest(args=args):
                self.assert_one_line(self.ias("tasks", *args), 1, needle)

    def test_closed_stdout(self):
        read_end, write_end = os.pipe()
        os.close(read_end)                                   # like `| head -1` that has already exited
        try:
            result = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills", "--json"], stdout=write_end,
                                    stderr=subprocess.PIPE, text=True, env=self.env, cwd=self.tmp, timeout=60)
        finally:
            os.close(write_end)
        self.assert_one_line(result, 1, "broken pipe")


class EntryPointTest(unittest.TestCase):
    """`--version`, and `python ias.py` run by an interpreter without iAs's dependencies (SPEC §11)."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-entry-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.system = "/usr/bin/python3"
        probe = subprocess.run([self.system, "-c", "import psycopg"], capture_output=True)
        self.assertNotEqual(probe.returncode, 0, "the test needs a system python3 without psycopg")

    def checkout(self, venv: bool) -> Path:
        """A checkout: a copy of ias.py, links to this one's ias/ and pyproject.toml, with a .venv or none."""
        shutil.copy(REPO / "ias.py", self.tmp / "ias.py")       # a link would be resolved to this checkout
        for name in ("ias", "pyproject.toml"):
            (self.tmp / name).symlink_to(REPO / name)
        if venv:
            (self.tmp / ".venv").symlink_to(Path(sys.prefix))     # this test's venv, which has the dependencies
        return self.tmp

    def test_version_is_the_pyproject_s(self):
        import tomllib
        expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        done = subprocess.run([sys.executable, str(REPO / "ias.py"), "--version"], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (0, f"ias {expected}\n", ""))

    def test_outside_the_venv_it_runs_again_with_the_venv_s_python(self):
        root = self.checkout(venv=True)
        done = subprocess.run([self.system, "ias.py", "--version"], cwd=root, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual((done.returncode, done.stderr), (0, ""))
        self.assertRegex(done.stdout, r"^ias \d+\.\d+\.\d+\n$")

    def test_without_a_venv_one_line_says_to_run_make(self):
        root = self.checkout(venv=False)
        done = subprocess.run([self.system, "ias.py", "tasks", "list"], cwd=root, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.returncode, 1)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
        self.assertIn("run `make`", done.stderr)
        self.assertNotIn("Traceback", done.stderr)


# `asyncio.run` replaced by one that records whether the collector is on, and whether anything is frozen.
COLLECTOR = """
import asyncio, gc
from ias import cli
seen = []
asyncio.run = lambda command: (command.close(), seen.append([gc.isenabled(), gc.get_freeze_count() > 0]), 0)[-1]
gc.disable()
print(cli.main(["tasks", "list"]), seen)
"""


# What `ias skills` never uses, each a cost paid by every listing if imported: the event loop, the SDKs, the
# database side, the embedded cluster and the service installer, `setup`'s presets, the clock's time zone.
NOT_FOR_A_LISTING = ("asyncio", "openai", "psycopg", "ias.app", "ias.store", "ias.pgcluster", "ias.service",
                     "ias.setup", "ias.doctor", "ias.clock", "zoneinfo", "typing", "hashlib", "fractions")
LISTING = f"""
import contextlib, io, sys
from ias import cli
with contextlib.redirect_stdout(io.StringIO()):
    code = cli.main(["skills"])
print(code, *sorted(set({NOT_FOR_A_LISTING!r}) & set(sys.modules)))
"""


class StartUpTest(unittest.TestCase):
    """The cyclic collector, off while a command starts (`run` turns it off), is on again with the start's objects
    frozen when the command's coroutine runs; `main` called with it on (a test's process) changes nothing. A
    listing imports only what it uses."""

    def test_a_listing_imports_nothing_it_never_uses(self):
        data_dir = tempfile.mkdtemp(prefix="ias-start-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("IAS_")}
        done = subprocess.run([sys.executable, "-c", LISTING], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**env, "IAS_DATA_DIR": data_dir, "IAS_SKILLS_DIR": data_dir})
        self.assertEqual((done.returncode, done.stdout), (0, "0\n"), done.stderr)

    def test_the_collector_is_on_again_when_the_command_runs(self):
        data_dir = tempfile.mkdtemp(prefix="ias-gc-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        done = subprocess.run([sys.executable, "-c", COLLECTOR], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "IAS_DATA_DIR": data_dir})
        self.assertEqual((done.returncode, done.stdout), (0, "0 [[True, True]]\n"), done.stderr)

    def test_a_process_whose_collector_is_on_is_left_as_it_is(self):
        import gc
        from ias import cli
        frozen = gc.get_freeze_count()
        cli.started()
        self.assertEqual((gc.isenabled(), gc.get_freeze_count()), (True, frozen))


if __name__ == "__main__":
    unittest.main()


class ProviderChoiceTest(unittest.TestCase):
    """`setup --provider` takes exactly setup's presets, though the parser reads them only when it needs them."""

    def test_a_preset_is_taken_and_anything_else_is_a_usage_error_naming_them(self):
        from ias import cli
        from ias.setup import PRESETS
        names = [p.name for p in PRESETS]
        self.assertEqual(cli._parser().parse_args(["setup", "--provider", names[-1]]).provider, names[-1])
        for argv, stream, code in ((["setup", "--provider", "nope"], redirect_stderr, 2),
                                   (["setup", "--help"], redirect_stdout, 0)):
            with self.subTest(argv=argv), stream(io.StringIO()) as out, self.assertRaises(SystemExit) as exited:
                cli._parser().parse_args(argv)
            self.assertEqual(exited.exception.code, code)
            expected = (f"invalid choice: 'nope' (choose from {', '.join(map(repr, names))})" if code
                        else f"--provider {{{','.join(names)}}}")
            self.assertIn(expected, out.getvalue())

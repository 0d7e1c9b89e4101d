"""`ias run`, `ias approvals` and `ias audit` as a user runs them: real processes, real PostgreSQL."""
import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from tests.support import FIXTURES, REPO, drop_schema, fresh_schema_dsn


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

    def test_errors(self):
        result = self.ias("run", "nope")
        self.assertEqual((result.returncode, json.loads(result.stdout)), (1, {"success": False, "error": "未知技能：nope"}))
        result = self.ias("run", "get_current_datetime", '{"format": 1}')
        self.assertEqual(result.returncode, 1)
        self.assertTrue(json.loads(result.stdout)["error"].startswith("参数错误：$.format"))
        self.assertEqual(self.ias("run", "get_current_datetime", "{oops").returncode, 2)

    def test_high_skill_without_terminal_is_not_confirmed(self):
        marker = self.tmp / "marker"
        result = self.ias("run", "mark_high", json.dumps({"marker": str(marker)}))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(json.loads(result.stdout), {"success": False, "error": "用户没有确认操作：mark_high"})
        self.assertIn("标准输入不是终端", result.stderr)
        self.assertFalse(marker.exists())

    def test_high_skill_confirmed_on_the_terminal(self):
        marker = self.tmp / "marker"
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py"), "run", "mark_high",
                                 json.dumps({"marker": str(marker), "note": "typed"})],
                                stdin=slave, stderr=slave, stdout=subprocess.PIPE, env=self.env, cwd=self.tmp)
        os.close(slave)
        try:
            screen = b""
            deadline = time.monotonic() + 30
            while b"(5\xe5\x88\x86" not in screen and time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 1)
                if ready:
                    screen += os.read(master, 4096)
            text = screen.decode()
            self.assertIn("⚠️ 操作确认", text)
            self.assertIn("· note：typed", text)
            code = re.search(r"确认码：(\d{6})", text).group(1)
            os.write(master, code.encode() + b"\n")
            out, _ = proc.communicate(timeout=30)
        finally:
            proc.kill()
            os.close(master)
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


if __name__ == "__main__":
    unittest.main()

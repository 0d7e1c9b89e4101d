"""The daemon and `--once` as real processes: replies, SIGTERM, sd_notify, the single-instance lock."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from tests.servers.llm import LLMServer, calls, text
from tests.support import FIXTURES, REPO, drop_schema, fresh_schema_dsn


def alive_in_group(pgid: int) -> list[int]:
    """Pids (not zombies) whose process group is `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


class DaemonTestCase(unittest.TestCase):
    def setUp(self):
        self.dsn, self.schema_name = fresh_schema_dsn()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-daemon-"))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_"))}
        self.env.update({"IAS_DATABASE_URL": self.dsn, "IAS_DATA_DIR": str(self.tmp),
                         "IAS_SKILLS_DIR": str(FIXTURES / "gate")})
        self.procs: list[subprocess.Popen] = []

    def tearDown(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        drop_schema(self.schema_name)
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def ias(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, cwd=self.tmp, timeout=60, stdin=subprocess.DEVNULL)

    def daemon(self, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py")], env={**self.env, **(env or {})}, cwd=self.tmp,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc


class OnceTest(DaemonTestCase):
    def test_once_plain_answer(self):
        with LLMServer([text("现在是上午九点。")]) as server:
            result = self.ias("--once", "现在几点", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url,
                                                        "IAS_MODEL": "test-model"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "现在是上午九点。\n")
        self.assertEqual(server.requests[0]["messages"][-1], {"role": "user", "content": "现在几点"})

    def test_once_with_a_tool_call(self):
        with LLMServer([calls(("get_current_datetime", {})), text("好了")]) as server:
            result = self.ias("--once", "几点", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url})
        self.assertEqual((result.returncode, result.stdout), (0, "好了\n"), result.stderr)
        self.assertTrue(json.loads(server.requests[1]["messages"][-1]["content"])["success"])

    def test_once_high_call_without_terminal_is_not_confirmed(self):
        marker = self.tmp / "m"
        with LLMServer([calls(("mark_high", {"marker": str(marker)})), text("没有确认")]) as server:
            result = self.ias("--once", "标记", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url})
        self.assertEqual(result.returncode, 0)
        self.assertIn("标准输入不是终端", result.stderr)
        self.assertEqual(json.loads(server.requests[1]["messages"][-1]["content"]),
                         {"success": False, "error": "用户没有确认操作：mark_high"})
        self.assertFalse(marker.exists())

    def test_once_errors(self):
        result = self.ias("--once", "你好")
        self.assertEqual(result.returncode, 1)
        self.assertIn("OPENAI_API_KEY", result.stderr)
        self.assertEqual(self.ias("--once", "/help").returncode, 0)
        with LLMServer([]) as server:        # the endpoint refuses the key: one apology, exit 1
            result = self.ias("--once", "hi", env={"OPENAI_API_KEY": "sk-bad", "OPENAI_BASE_URL": server.base_url})
        self.assertEqual(result.returncode, 1)
        self.assertNotIn("Traceback", result.stdout + result.stderr)


class DoctorTest(DaemonTestCase):
    def test_all_checks_pass_with_a_reachable_endpoint(self):
        with LLMServer([]) as server:
            result = self.ias("doctor", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url,
                                             "IAS_MODEL": "test-model"})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        lines = result.stdout.splitlines()
        for check in ("config", "secret key", "skills", "database", "channel", "llm"):
            self.assertTrue(any(line.split(":")[0].endswith(check) for line in lines), (check, lines))
        self.assertIn("test-model found", result.stdout)
        self.assertNotIn("FAIL", result.stdout)

    def test_failures_are_one_line_each(self):
        result = self.ias("doctor", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
        self.assertEqual(result.returncode, 1)
        self.assertRegex(result.stdout, r"(?m)^FAIL  llm: http://127.0.0.1:9/v1 unreachable \(\w+\)$")
        self.assertNotIn("Traceback", result.stdout + result.stderr)
        self.assertIn("FAIL  llm: OPENAI_API_KEY is not set", self.ias("doctor").stdout)


class DaemonTest(DaemonTestCase):
    def test_sigterm_stops_promptly_and_kills_running_skills(self):
        sock_path = str(self.tmp / "notify.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(sock_path)
        listener.settimeout(30)
        try:
            proc = self.daemon(env={"NOTIFY_SOCKET": sock_path, "OPENAI_API_KEY": "sk-never-visible"})
            self.assertEqual(listener.recv(1024).split(b"\n")[0], b"READY=1")
            pidfile = self.tmp / "pgid"
            proc.stdin.write(f'/run sleepy {{"pidfile": "{pidfile}"}}\n')
            proc.stdin.flush()
            deadline = time.monotonic() + 20
            while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.05)
            pgid = int(pidfile.read_text())
            self.assertTrue(alive_in_group(pgid))
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
            self.assertLess(time.monotonic() - start, 5)
            self.assertEqual(proc.returncode, 0, proc.stderr.read())
            self.assertEqual(listener.recv(1024), b"STOPPING=1")
            self.assertEqual(alive_in_group(pgid), [])
        finally:
            listener.close()
        audit = self.ias("audit", "--limit", "20").stdout
        for event in ("daemon_start", "skill_started", "skill_finished", "daemon_stop"):
            self.assertIn(event, audit)

    def test_no_code_is_printed_to_a_console_without_a_terminal(self):
        proc = self.daemon()                      # stdout is a pipe here, the journal under systemd
        marker = self.tmp / "m"
        proc.stdin.write(f'/run mark_high {{"marker": "{marker}"}}\n')
        proc.stdin.flush()
        reply = "".join(proc.stdout.readline() for _ in range(4))
        self.assertIn("用户没有确认操作：mark_high", reply)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        self.assertNotIn("确认码", reply + out + err)
        self.assertIn("cannot ask owner for a confirmation on the console channel", err)
        self.assertFalse(marker.exists())

    def test_second_instance_refuses(self):
        first = self.daemon()
        first.stdin.write("/help\n")
        first.stdin.flush()
        self.assertIn("/reset", first.stdout.readline() + first.stdout.readline() + first.stdout.readline()
                      + first.stdout.readline() + first.stdout.readline())
        second = self.ias()
        self.assertEqual(second.returncode, 1)
        self.assertIn("another iAs daemon is already running", second.stderr)
        first.send_signal(signal.SIGTERM)
        self.assertEqual(first.wait(timeout=10), 0)

    def test_leftover_approvals_expire_at_start_and_owner_is_told(self):
        import psycopg
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute((REPO / "schema.sql").read_text())
            conn.execute("INSERT INTO pending_approvals (expires_at, user_id, skill_name, params, code_hash) "
                         "VALUES (now() + interval '5 minutes', 'owner', 'mark_high', '{}', 'v1:x')")
        proc = self.daemon()
        self.assertIn("之前等待确认的操作已失效：mark_high", proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0)
        self.assertIn("expired", self.ias("approvals", "--all").stdout)


if __name__ == "__main__":
    unittest.main()

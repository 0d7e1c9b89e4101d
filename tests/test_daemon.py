"""The daemon and `--once` as real processes: replies, SIGTERM, sd_notify, the single-instance lock,
faults (a lost database, a crashed task, kill -9 mid-skill) and relative paths."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from pathlib import Path

import psycopg

from ias.pgcluster import Cluster, find_bindir
from ias.processes import identity
from ias.store import AuditEntry
from ias.unwritten import End
from tests.servers.llm import LLMServer, calls, text
from tests.support import FIXTURES, REPO, drop_schema, fresh_schema_dsn, granted, skill_pgid, slow, with_env
from tests.test_runner import running


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



def wait_until(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Lines:
    """Every line a stream produces, read by a thread; `wait_for` blocks until one contains a needle."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, needle: str, timeout: float = 20.0, start: int = 0) -> int:
        """The index of the first line from `start` on that contains `needle`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for i in range(start, len(self.lines)):
                    if needle in self.lines[i]:
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {needle!r} in {timeout}s; got:\n{''.join(self.lines)}")
                self._changed.wait(left)

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


# The daemon as `ias` runs it, with the database-lost limit injected (and, on request, a
# scheduler that crashes at once: the fault a supervisor must notice).
DRIVER = """
import asyncio, logging, sys
from ias import config, daemon, scheduler
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
if sys.argv[2] == "crash":
    async def crash(self):
        raise RuntimeError("scheduler exploded")
    scheduler.Scheduler.run = crash
options = {}
if sys.argv[2] == "lowdisk":                # 1 % free under the data directory
    from types import SimpleNamespace
    options["statvfs"] = lambda path: SimpleNamespace(f_frsize=4096, f_blocks=1_000_000, f_bavail=10_000)
sys.exit(asyncio.run(daemon.run_daemon(config.load(), db_lost_limit=float(sys.argv[1]), **options)))
"""


@slow
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

    def daemon(self, env: dict | None = None, driver: tuple[float, str] | None = None) -> subprocess.Popen:
        """The daemon (`ias.py`, or DRIVER with (db_lost_limit, mode))."""
        args = [str(REPO / "ias.py")] if driver is None else ["-c", DRIVER, str(driver[0]), driver[1]]
        proc = subprocess.Popen([sys.executable, *args], env={**self.env, **(env or {})}, cwd=self.tmp,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def say(self, proc: subprocess.Popen, line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def audit_rows(self, *events: str) -> list[tuple]:
        """(event, decision, detail) of this schema's audit rows with those events, oldest first."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT event, decision, detail FROM audit_log WHERE event = ANY(%s) ORDER BY id",
                                (list(events),)).fetchall()


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
        marker = granted("m")
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
        for check in ("config", "secret key", "skills", "database", "channel", "outbox", "llm"):
            self.assertTrue(any(line.split(":")[0].endswith(check) for line in lines), (check, lines))
        self.assertIn("test-model found", result.stdout)
        self.assertNotIn("FAIL", result.stdout)
        self.assertIn("warn  outbox: 0 messages queued; fallback: none", result.stdout)
        configured = self.ias("doctor", env={"IAS_NOTIFY_WEBHOOK_URL": "http://127.0.0.1:9/hook"})
        self.assertIn("ok    outbox: 0 messages queued; fallback: webhook\n", configured.stdout)

    def test_the_model_and_the_key_as_the_endpoint_sees_them(self):
        with LLMServer([]) as server, LLMServer([], models=None) as bare:
            env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url}
            unlisted = self.ias("doctor", env={**env, "IAS_MODEL": "gpt-9"})
            refused = self.ias("doctor", env={**env, "OPENAI_API_KEY": "sk-wrong"})
            unlisting = self.ias("doctor", env={**env, "OPENAI_BASE_URL": bare.base_url, "IAS_MODEL": "gpt-9"})
        self.assertIn(f"\nwarn  llm: {server.base_url}: model gpt-9 is not among the 1 models it lists; set IAS_MODEL "
                      "to one of them (or run `ias setup`)\n", unlisted.stdout)
        self.assertEqual(unlisted.returncode, 0, unlisted.stdout)       # a warning does not fail
        self.assertIn(f"\nFAIL  llm: {server.base_url}: 大模型服务拒绝了密钥：请检查 OPENAI_API_KEY\n", refused.stdout)
        self.assertEqual(refused.returncode, 1)
        self.assertIn(f"\nok    llm: {bare.base_url}: no model list offered, model gpt-9 not checked\n", unlisting.stdout)

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
            pidfile = granted("pgid")
            proc.stdin.write(f'/run sleepy {{"pidfile": "{pidfile}"}}\n')
            proc.stdin.flush()
            deadline = time.monotonic() + 20
            while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.05)
            pgid = skill_pgid(pidfile)      # the skill's own $$ is a pid of its sandbox
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
        marker = granted("m")
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

    def test_sighup_and_exit_stop_cleanly(self):
        """A closed terminal (SIGHUP) stops the daemon as SIGTERM does; so does /exit on the console."""
        for stop in ("SIGHUP", "/exit"):
            with self.subTest(stop=stop):
                proc = self.daemon()
                Lines(proc.stderr).wait_for("iAs is running")
                if stop == "SIGHUP":
                    proc.send_signal(signal.SIGHUP)
                else:
                    self.say(proc, "/exit")
                self.assertEqual(proc.wait(timeout=20), 0)
        stops = self.audit_rows("daemon_start", "daemon_stop")
        self.assertEqual([event for event, _, _ in stops], ["daemon_start", "daemon_stop"] * 2)

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


class FaultTest(DaemonTestCase):
    """What the daemon does when things break under it."""

    def setUp(self):
        super().setUp()
        os.chmod(self.tmp, 0o755)       # an embedded cluster here runs as the postgres OS user under root
        self.env["IAS_SKILLS_DIR"] = str(FIXTURES / "daemon")

    def start_nap(self, proc: subprocess.Popen) -> list[int]:
        """/run nap on the daemon's console; once it runs, the host's pids of its processes (its sandbox's
        bwrap, bash and the sleep: those given its pid file)."""
        pidfile = granted("pids")
        self.say(proc, f'/run nap {{"pidfile": "{pidfile}"}}')
        wait_until(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, what="the skill's pid file")
        return with_env(f"IAS_PARAM_PIDFILE={pidfile}")

    def throwaway_cluster(self, name: str) -> Cluster:
        cluster = Cluster(self.tmp / name, fsync=False)
        cluster.start()
        self.addCleanup(cluster.stop)
        return cluster

    @staticmethod
    def postmaster(cluster_dir: Path) -> int:
        return int((cluster_dir / "postmaster.pid").read_text().split()[0])

    def test_sigterm_mid_skill_records_skill_finished_every_time(self):
        for round_ in range(10):
            proc = self.daemon()
            pids = self.start_nap(proc)
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=15), 0, proc.stderr.read())
            self.assertFalse(any(map(running, pids)), f"round {round_}: the skill outlived the daemon")
            proc.stdin.close()
        rows = self.audit_rows("skill_started", "skill_finished")
        started = [detail for event, _, detail in rows if event == "skill_started"]
        finished = [detail for event, _, detail in rows if event == "skill_finished"]
        self.assertEqual(len(started), 10)
        self.assertEqual(sorted(started), sorted(finished))      # every call ended, and is matched by its tag
        self.assertEqual(list(os.listdir(self.tmp / "runs")), [])

    def test_an_end_a_stopped_daemon_kept_is_written_at_start_never_interrupted(self):
        first = self.daemon()                      # the schema; then the state a daemon stopped in an outage left
        Lines(first.stderr).wait_for("iAs is running")
        first.send_signal(signal.SIGTERM)
        self.assertEqual(first.wait(timeout=10), 0)
        pid, start = identity()
        dead_tag = f"call={uuid.uuid4().hex} pid={pid} start={start + 1}"     # a process that is gone
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO audit_log (event, skill_name, detail, prev_hash, hash) "
                         "VALUES ('skill_started', 'nap', %s, '', '')", (dead_tag,))
        kept = self.tmp / "unwritten-ends.jsonl"
        kept.write_text(End(AuditEntry("skill_finished", skill_name="nap", decision="auto", exit_code=0,
                                       detail=dead_tag)).line())
        proc = self.daemon()
        Lines(proc.stderr).wait_for("iAs is running")
        self.assertEqual(self.audit_rows("skill_started", "skill_finished", "skill_interrupted"),
                         [("skill_started", None, dead_tag), ("skill_finished", "auto", dead_tag)])
        self.assertFalse(kept.exists())
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0)

    def test_kill_9_mid_skill_then_start_records_interrupted_and_cleans_up(self):
        first = self.daemon()
        pids = self.start_nap(first)
        runs = self.tmp / "runs"
        self.assertEqual(len(os.listdir(runs)), 1)
        first.kill()
        first.wait(timeout=10)
        # PDEATHSIG ends its bwrap, and with it the whole pid namespace of the sandbox
        wait_until(lambda: not any(map(running, pids)), 5, "the skill to die with the daemon (PDEATHSIG)")
        # A one-off command that runs right now (this test process) must keep its run and its call.
        pid, start = identity()
        live_run = runs / f"run-{pid}-{start}-live"
        live_run.mkdir()
        live_tag = f"call={uuid.uuid4().hex} pid={pid} start={start}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO audit_log (event, skill_name, detail, prev_hash, hash) "
                         "VALUES ('skill_started', 'nap', %s, '', '')", (live_tag,))

        second = self.daemon()
        Lines(second.stderr).wait_for("iAs is running")
        self.assertFalse(any(map(running, pids)), "what the dead run left running was not ended")
        self.assertEqual(os.listdir(runs), [live_run.name])
        rows = self.audit_rows("skill_started", "skill_finished", "skill_interrupted")
        dead_tag = rows[0][2]
        self.assertEqual(rows, [("skill_started", "auto", dead_tag), ("skill_started", None, live_tag),
                                ("skill_interrupted", "interrupted", dead_tag)])
        second.send_signal(signal.SIGTERM)
        self.assertEqual(second.wait(timeout=10), 0)
        self.assertEqual(len(self.audit_rows("skill_interrupted")), 1)        # once, not at every start

    def test_lost_embedded_database_is_restarted_and_the_daemon_answers_again(self):
        env = {"IAS_DATABASE_URL": "", "IAS_DATA_DIR": str(self.tmp / "data")}
        proc = self.daemon(env=env, driver=(30, "normal"))
        self.addCleanup(self.stop_embedded, self.tmp / "data" / "pg")
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running", timeout=60)
        self.say(proc, "/reset")
        out.wait_for("对话记录已清空。")
        os.kill(self.postmaster(self.tmp / "data" / "pg"), signal.SIGKILL)
        lost = log.wait_for("database lost")
        log.wait_for("database reachable again", timeout=60, start=lost)
        self.say(proc, "/reset")
        out.wait_for("对话记录已清空。", start=1)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0, log.text())
        self.assertNotIn("Traceback", log.text())

    def test_a_pg_ctl_restart_costs_at_most_2_s_after_the_server_is_ready(self):
        datadir = self.tmp / "data" / "pg"
        proc = self.daemon(env={"IAS_DATABASE_URL": "", "IAS_DATA_DIR": str(self.tmp / "data")}, driver=(30, "normal"))
        self.addCleanup(self.stop_embedded, datadir)
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running", timeout=60)
        self.say(proc, "/reset")
        out.wait_for("对话记录已清空。")
        before = len(log.lines)
        restart = subprocess.Popen([str(find_bindir() / "pg_ctl"), "restart", "-D", str(datadir), "-m", "fast", "-w",
                                    "-l", str(datadir / "server.log")], cwd="/", user=datadir.stat().st_uid,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(restart)
        self.say(proc, "/reset")                  # in the outage (the router answers it at once, see below)
        self.assertEqual(restart.wait(timeout=60), 0, restart.stderr.read())    # nobody fought the restart
        ready = time.monotonic()
        # The monitor saw the outage and is back within 2 s of the server's readiness; the next message is answered.
        log.wait_for("database reachable again", timeout=2, start=log.wait_for("database lost", start=before))
        self.assertLess(time.monotonic() - ready, 2)
        self.say(proc, "/reset")
        out.wait_for("对话记录已清空。", timeout=max(0.1, ready + 2.5 - time.monotonic()), start=2)
        lines = "".join(log.lines[before:])
        self.assertNotIn("embedded PostgreSQL started", lines)      # iAs started no server of its own
        self.assertNotIn("pg_ctl failed", lines)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0, log.text())
        self.assertNotIn("Traceback", log.text())

    def test_low_disk_space_is_told_to_the_owner_once(self):
        proc = self.daemon(driver=(30, "lowdisk"))
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        out.wait_for("磁盘空间不足：数据目录所在分区仅剩 1.0%（可用 39.1 MB，共 3.8 GB；", timeout=30)
        self.say(proc, "/reset")
        out.wait_for("对话记录已清空。")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0, log.text())
        self.assertEqual(len([line for line in out.lines if "磁盘空间不足" in line]), 1)

    def stop_embedded(self, datadir: Path) -> None:
        cluster = Cluster(datadir)
        cluster.started = True
        cluster.stop()

    def test_database_gone_for_good_exits_non_zero_with_one_line(self):
        cluster = self.throwaway_cluster("pg-gone")
        proc = self.daemon(env={"IAS_DATABASE_URL": cluster.dsn}, driver=(2, "normal"))
        log, out = Lines(proc.stderr), Lines(proc.stdout)
        log.wait_for("iAs is running")
        os.kill(self.postmaster(cluster.datadir), signal.SIGKILL)
        log.wait_for("database lost")
        self.say(proc, "/reset")                   # meanwhile: held, and the owner told so, not silence
        out.wait_for("数据库暂时不可用，恢复后会处理你的消息。")
        self.assertEqual(proc.wait(timeout=30), 1)
        errors = log.text()
        self.assertEqual(len([line for line in errors.splitlines() if "database unreachable for" in line]), 1, errors)
        self.assertNotIn("Traceback", errors)

    def test_a_crashed_background_task_stops_the_daemon_loudly(self):
        proc = self.daemon(driver=(60, "crash"))
        self.assertEqual(proc.wait(timeout=30), 1)
        errors = proc.stderr.read()
        self.assertIn("task scheduler crashed", errors)
        self.assertIn("Traceback", errors)
        self.assertIn("RuntimeError: scheduler exploded", errors)
        self.assertIn("daemon_stop", self.ias("audit").stdout)


class PathsTest(DaemonTestCase):
    def test_relative_data_and_skills_dirs_give_skills_absolute_paths(self):
        work = self.tmp / "work"
        shutil.copytree(FIXTURES / "daemon" / "home", work / "skills" / "home")
        before = sorted(p.relative_to(work) for p in (work / "skills").rglob("*"))
        result = subprocess.run([sys.executable, str(REPO / "ias.py"), "run", "home"], capture_output=True, text=True,
                                env={**self.env, "IAS_DATA_DIR": "data", "IAS_SKILLS_DIR": "skills"}, cwd=work,
                                timeout=60, stdin=subprocess.DEVNULL)
        self.assertEqual(result.returncode, 0, result.stderr)
        reply = json.loads(result.stdout)
        self.assertTrue(reply["success"], reply)
        hi, pwd, home = reply["output"].splitlines()
        self.assertEqual((hi, pwd), ("hi", str(work / "skills" / "home")))
        self.assertTrue(home.startswith(f"HOME={work / 'data' / 'runs'}/run-"), home)
        self.assertEqual(sorted(p.relative_to(work) for p in (work / "skills").rglob("*")), before)
        self.assertEqual(os.listdir(work / "data" / "runs"), [])


if __name__ == "__main__":
    unittest.main()

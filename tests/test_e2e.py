"""End to end: iAs run as the README says, from a fresh copy of the repository, under faults.

Default settings (no IAS_DATA_DIR, no IAS_DATABASE_URL: the embedded cluster in `<copy>/var/pg`),
the real entry point (`python ias.py …`) as subprocesses, a pty to type confirmation codes, the
daemon driven through its console with the suite's local OpenAI-compatible endpoint. Each class
shares one copy (one initdb); each test starts with the copy's cluster stopped and nothing
running, and kills whatever it left (tests/e2e_support.py). The contract is SPEC.md §2–§7 and
issue 10's "Must show"; every wait is bounded and event- or poll-driven, none sleeps for long.
"""
import json
import os
import signal
import subprocess
import time
import unittest
from contextlib import contextmanager

from tests.e2e_support import (
    ECHO,
    POLL,
    STEP,
    Copy,
    Daemon,
    EchoLLM,
    NotifySocket,
    Result,
    finish,
    group_alive,
    kill_group,
    llm_env,
    wait_until,
)
from tests.servers.llm import LLMServer, calls, text
from tests.support import slow

DB_LOST_LIMIT = 60.0        # seconds a daemon may take to answer again after its database died (SPEC §4)
EXIT_MARGIN = 15.0          # seconds more for it to exit non-zero instead ("about a minute")
SIGTERM_ROUNDS = 10
PROBE_REPLY = 10.0          # seconds the daemon may take to answer anything while its database is lost
PROBE_PAUSE = 0.5           # seconds between probes that got a "not now" answer


def succeeded(result: Result) -> bool:
    """Exit 0 and an LLM-visible result with `success: true` on stdout."""
    try:
        return result.returncode == 0 and json.loads(result.stdout).get("success") is True
    except (ValueError, AttributeError):
        return False


def hold_args(pidfile, until=None) -> str:
    return json.dumps({"pidfile": str(pidfile), **({"until": str(until)} if until else {})})


@slow
class E2ETestCase(unittest.TestCase):
    """One fresh copy per class; every test starts and ends with nothing of it running."""
    copy: Copy

    @classmethod
    def setUpClass(cls):
        cls.copy = Copy()
        cls.addClassCleanup(cls.copy.remove)

    def setUp(self):
        self.copy.reset()
        self.addCleanup(self.copy.reset)

    @contextmanager
    def holding(self):
        """A one-off command (`ias run e2e_hold`) that is mid-skill, so it uses the cluster, until the block ends."""
        pidfile, release = self.copy.name("hold"), self.copy.name("release")
        proc = self.copy.spawn("run", "e2e_hold", hold_args(pidfile, release), env=SHORT_LINGER,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.copy.read_pidfile(pidfile, watch=proc)
        try:
            yield proc
        finally:
            release.touch()
        result = finish(proc)
        self.assertTrue(succeeded(result), f"the holding command failed: {result.describe()}")

    def assertAnswers(self, daemon: Daemon, message: str, why: str = "") -> None:
        """The daemon answers `message` (through the echo model, so the turn used the database)."""
        line = daemon.reply(message)
        self.assertEqual(line, ECHO + message, f"{why}: no echo from the daemon (exit {daemon.proc.poll()}); "
                                               f"log:\n{daemon.stderr()[-3000:]}")

    def audit_count(self, *needles: str) -> int:
        """Rows of `ias audit` containing every needle."""
        return sum(all(n in line for n in needles) for line in self.copy.audit_lines())


class DefaultsTest(E2ETestCase):
    """One-off commands under `make run` defaults: paths, NUL output, hostile input."""

    def test_approved_shell_command_under_defaults(self):
        before = self.copy.tree("skills", "resources")
        result, screen = self.copy.confirm("run", "execute_shell", json.dumps({"command": "echo hi; pwd"}))
        self.assertIn("execute_shell", screen)
        self.assertTrue(succeeded(result), result.describe())
        lines = json.loads(result.stdout)["stdout"].splitlines()
        self.assertEqual(lines[0], "hi")
        self.assertTrue(os.path.isabs(lines[1]), lines)
        self.assertFalse(os.path.exists(lines[1]), "the run directory was not removed")
        # A skill writing to ~ (as many tools' caches do) leaves nothing in the repository either.
        home = self.copy.ias("run", "e2e_home")
        self.assertTrue(succeeded(home), home.describe())
        self.assertTrue(os.path.isabs(json.loads(home.stdout)["output"].strip()), home.stdout)
        self.assertEqual(self.copy.tree("skills", "resources") - before, set())

    def test_nul_output_of_an_approved_call(self):
        with LLMServer([calls(("execute_shell", {"command": "head -c3 /dev/zero"})), text("已执行。")]) as llm:
            result, _ = self.copy.confirm("--once", "执行一下", env=llm_env(llm))
        self.assertEqual((result.returncode, result.stdout), (0, "已执行。\n"), result.describe())
        seen = json.loads(llm.requests[1]["messages"][-1]["content"])
        self.assertIs(seen["success"], True, seen)
        with self.holding(), self.copy.connect_sql() as conn:
            status, stored = conn.execute("SELECT status, result FROM pending_approvals WHERE skill_name = "
                                          "'execute_shell' ORDER BY created_at DESC LIMIT 1").fetchone()
        self.assertEqual(status, "approved")
        self.assertIsNotNone(stored, "the approved run's result was not recorded")
        self.assertIs(stored["success"], True, stored)
        self.assertRegex(self.copy.ias("approvals", "--all").stdout, r"approved\s+owner\s+execute_shell")
        finished = [line for line in self.copy.audit_lines() if "skill_finished" in line and "execute_shell" in line]
        self.assertTrue(finished and "exit=0" in finished[-1], finished)
        verify = self.copy.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 0, verify.describe())

    def test_hostile_command_line_input(self):
        usage = {                            # SPEC §2: one line naming the problem, exit 2
            "audit --limit -1": ("audit", "--limit", "-1"),
            "audit --limit 10**20": ("audit", "--limit", "99999999999999999999"),
            "run with 100,000 nested [": ("run", "get_current_datetime", "[" * 100_000),
            "run with a 5,000-digit number": ("run", "get_current_datetime", '{"format": ' + "1" * 5000 + "}"),
        }
        for label, args in usage.items():
            with self.subTest(label):
                result = self.copy.ias(*args)
                self.assertFalse("Traceback" in result.stdout + result.stderr, result.describe())
                self.assertEqual(result.returncode, 2, result.describe())
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.describe())
        refused = {                          # a call the gate refuses: its result on stdout, exit 1
            "invalid UTF-8 skill name": (b"run", b"\xff\xfe"),
            "invalid UTF-8 in the JSON": (b"run", b"get_current_datetime", b'{"format": "\xff"}'),
        }
        for label, args in refused.items():
            with self.subTest(label):
                result = self.copy.ias(*args)
                self.assertFalse("Traceback" in result.stdout + result.stderr, result.describe())
                self.assertEqual(result.returncode, 1, result.describe())
                self.assertIs(json.loads(result.stdout)["success"], False, result.describe())
        with self.subTest("skills --json | head -1"):
            read, write = os.pipe()
            os.close(read)                   # the reader is gone before the first write: EPIPE
            proc = self.copy.spawn("skills", "--json", stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE)
            os.close(write)
            _, err = proc.communicate(timeout=STEP)
            err = err.decode("utf-8", "replace")
            self.assertFalse("Traceback" in err or "BrokenPipeError" in err, err[-3000:])
            self.assertIn(proc.returncode, (0, 1), err)
            self.assertLessEqual(len(err.strip().splitlines()), 1, err)


# The cluster lingers after the last iAs process (IAS_PG_LINGER, 30 s by default); these tests wait it out.
SHORT_LINGER = {"IAS_PG_LINGER": "1"}


class ParallelCommandsTest(E2ETestCase):
    """Many one-off commands at once on a stopped cluster (SPEC §4: concurrent starts are safe)."""

    def test_parallel_one_off_commands_on_a_stopped_cluster(self):
        for round_ in range(1, 4):           # round 1 also runs initdb (a fresh copy)
            procs = [self.copy.spawn("run", "get_current_datetime", "{}", env=SHORT_LINGER, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(8)]
            results = [finish(proc, 2 * STEP) for proc in procs]
            failed = [r for r in results if not succeeded(r)]
            self.assertFalse(failed, f"round {round_}: {8 - len(failed)} of 8 succeeded; first failure:\n"
                                         + (failed[0].describe() if failed else ""))
            # No iAs process runs now: after the linger nothing may be left of the cluster (nor its reaper).
            self.assertTrue(wait_until(lambda: not self.copy.cluster_processes(), 15),
                            f"round {round_}: left running: {self.copy.cluster_processes()}")


class DaemonTest(E2ETestCase):
    """The daemon with one-off commands beside it, and killed or stopped at the worst moments."""

    def test_daemon_keeps_answering_through_one_off_commands(self):
        with EchoLLM() as llm:
            with self.holding():             # a command started the cluster and still runs when the daemon starts
                daemon = self.copy.daemon({**llm_env(llm), **SHORT_LINGER})
                self.assertAnswers(daemon, "你好", "beside a running command")
            self.assertAnswers(daemon, "命令结束了", "after the command that started the cluster exited")
            for i in range(1, 21):
                result = self.copy.ias("run", "get_current_datetime", "{}", env=SHORT_LINGER)
                self.assertTrue(succeeded(result), f"command {i}: {result.describe()}")
                self.assertAnswers(daemon, f"第{i}条命令之后", f"after command {i}")
            self.assertEqual(daemon.terminate(), 0, daemon.stderr()[-3000:])
        self.assertTrue(wait_until(lambda: not self.copy.cluster_processes(), 15),
                        f"left running after the last iAs process: {self.copy.cluster_processes()}")

    def test_console_survives_invalid_utf8(self):
        with EchoLLM() as llm:
            daemon = self.copy.daemon(llm_env(llm))
            self.assertAnswers(daemon, "你好", "before")
            daemon.drain()
            daemon.send(b"\xff\xfe hi \xe4\xbd")
            line = daemon.next_line()
            self.assertTrue(line and line.startswith(ECHO) and "hi" in line,
                            f"{line!r}; log:\n{daemon.stderr()[-3000:]}")
            self.assertAnswers(daemon, "还在吗", "after a line of invalid UTF-8")
            self.assertEqual(daemon.terminate(), 0, daemon.stderr()[-3000:])

    def test_sigterm_during_a_skill_records_skill_finished(self):
        started = self.audit_count("skill_started", "e2e_hold")
        finished = self.audit_count("skill_finished", "e2e_hold")
        with EchoLLM() as llm:
            for round_ in range(1, SIGTERM_ROUNDS + 1):
                pidfile = self.copy.name("sigterm")
                if round_ % 2:               # the model calls the skill in a turn
                    daemon = self.copy.daemon(llm_env(llm))
                    llm.tool = ("e2e_hold", {"pidfile": str(pidfile)})
                    daemon.send("请运行 e2e_hold")
                else:                        # the owner's /run
                    daemon = self.copy.daemon()
                    daemon.send("/run e2e_hold " + hold_args(pidfile))
                pgid, _ = self.copy.read_pidfile(pidfile, watch=daemon.proc)
                self.assertEqual(daemon.terminate(), 0, f"round {round_}: {daemon.stderr()[-3000:]}")
                self.assertTrue(wait_until(lambda: not group_alive(pgid), 5), f"round {round_}: the skill still runs")
        # Each call writes at most one skill_finished row: SIGTERM_ROUNDS more rows means every time.
        self.assertEqual((self.audit_count("skill_started", "e2e_hold") - started,
                          self.audit_count("skill_finished", "e2e_hold") - finished), (SIGTERM_ROUNDS, SIGTERM_ROUNDS),
                         "(skill_started, skill_finished) rows written by the interrupted calls")

    def test_kill_9_of_the_daemon_mid_skill(self):
        pidfile = self.copy.name("orphan")
        with EchoLLM() as llm:
            llm.tool = ("e2e_hold", {"pidfile": str(pidfile)})
            first = self.copy.daemon(llm_env(llm))
            first.send("请运行 e2e_hold")         # the model calls the skill; the turn waits for it
            pgid, home = self.copy.read_pidfile(pidfile, watch=first.proc)
            interrupted = self.audit_count("interrupted", "skill=e2e_hold")
            first.kill9()
        second = self.copy.daemon()
        second.send("/help")
        self.assertIsNotNone(second.wait_for("/reset"), f"the next daemon does not answer: {second.stderr()[-3000:]}")
        self.assertTrue(wait_until(lambda: not group_alive(pgid), 10),
                        f"the skill outlived its daemon: {group_alive(pgid)}")
        self.assertEqual(self.audit_count("interrupted", "skill=e2e_hold") - interrupted, 1,
                         "\n".join(self.copy.audit_lines()[-10:]))
        self.assertFalse(home.exists(), f"leftover run directory {home}")
        self.assertEqual(second.terminate(), 0, second.stderr()[-3000:])

    def test_kill_9_of_the_postmaster(self):
        with EchoLLM() as llm:
            daemon = self.copy.daemon(llm_env(llm))
            self.assertAnswers(daemon, "在吗", "before the fault")
            self.assertSecondDaemonRefused("while the first one serves")
            postmaster = self.copy.postmaster_pid()
            self.assertIsNotNone(postmaster, "the daemon's cluster is not running")
            os.kill(postmaster, signal.SIGKILL)
            killed = time.monotonic()
            self.assertSecondDaemonRefused("right after kill -9 of the postmaster")
            if self.answers_again(daemon, killed + DB_LOST_LIMIT):
                self.assertSecondDaemonRefused("after the daemon recovered")
                self.assertEqual(daemon.terminate(), 0, daemon.stderr()[-3000:])
                return
            try:
                code = daemon.proc.wait(timeout=max(1.0, killed + DB_LOST_LIMIT + EXIT_MARGIN - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.fail(f"the daemon neither answered again within {DB_LOST_LIMIT:g}s nor exited; log:\n"
                          f"{daemon.stderr()[-3000:]}")
            self.assertNotEqual(code, 0, "the daemon gave up on its database but exited 0")
            self.assertFalse("Traceback" in daemon.stderr(), daemon.stderr()[-3000:])

    def answers_again(self, daemon: Daemon, deadline: float) -> bool:
        """Probe the daemon until an echo comes back before `deadline`; False if it exits or never answers.

        Meanwhile every probe must get some answer (e.g. "database unavailable") within PROBE_REPLY
        seconds: silence is a failure (issue 10, item 2).
        """
        n = 0
        while daemon.proc.poll() is None and (left := deadline - time.monotonic()) > 0:
            n += 1
            daemon.send(f"探测{n}")
            line = daemon.next_line(PROBE_REPLY)
            if line is None:
                self.assertIsNotNone(daemon.proc.poll(), f"probe {n} got no answer within {PROBE_REPLY:g}s; log:\n"
                                                         f"{daemon.stderr()[-3000:]}")
                return False
            if line.startswith(ECHO + "探测"):
                return True
            time.sleep(min(PROBE_PAUSE, max(0.0, left)))
        return False

    def assertSecondDaemonRefused(self, when: str) -> None:
        """A second daemon on the same data directory exits non-zero with one clear line, never READY=1."""
        notify = NotifySocket(self.copy.scratch)
        self.addCleanup(notify.close)
        proc = self.copy.spawn(env={"NOTIFY_SOCKET": notify.path}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + STEP
        while proc.poll() is None and time.monotonic() < deadline:
            if notify.ready(POLL * 4):
                kill_group(proc)
                self.fail(f"{when}: a second daemon started and said READY=1")
        if proc.poll() is None:
            kill_group(proc)
            self.fail(f"{when}: a second daemon was neither refused nor ready after {STEP:g}s")
        result = finish(proc)
        self.assertNotEqual(result.returncode, 0, f"{when}: {result.describe()}")
        self.assertFalse("Traceback" in result.stderr, f"{when}: {result.describe()}")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertTrue(len(lines) == 1 and "daemon" in lines[0].lower(), f"{when}: not one clear line: "
                                                                         f"{result.describe()}")


if __name__ == "__main__":
    unittest.main()

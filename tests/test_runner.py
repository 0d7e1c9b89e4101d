"""Runner: parameters as data, the environment from scratch, process groups killed, output capped."""
from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import stat
import subprocess
import tempfile
import time
import unittest
import uuid
from dataclasses import replace
from pathlib import Path
from unittest import mock

from ias import jsonschema as schema, processes, results, runner as runner_module
from ias.limits import ENV_TOTAL_MAX, ENV_VALUE_MAX, ERROR_TAIL, OUTPUT_HELD_MAX, STDOUT_TO_LLM
from ias.outcome import RunResult
from ias.runner import Runner
from ias.sandbox import Policy
from ias.skills import Skill
from tests.support import until, with_env

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runner"
BASH_ADDS = {"PWD", "SHLVL", "_"}   # what bash puts into its children's environment itself
GRACE = 0.3


def fixture_skill(name: str, *, timeout: float = 10.0, env: tuple[str, ...] = (), write: tuple[str, ...] = ()) -> Skill:
    """A Skill for tests/fixtures/runner/NAME, its script taken from the ```bash block of its SKILL.md;
    `write`: the paths its `## Sandbox` grants (where a test reads back what it did)."""
    directory = FIXTURES / name
    text = (directory / "SKILL.md").read_text(encoding="utf-8")
    execute = re.search(r"^## Execute\n```bash\n(.*?)^```", text, re.M | re.S).group(1)
    return Skill(name=name, title=name, description="", risk="low", parameters={"type": "object"},
                 execute=execute, timeout=timeout, env=env, directory=str(directory),
                 validator=schema.compile({"type": "object"}), sandbox=Policy(write=write))


def live_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group `pgid` that still run (zombies left to a non-reaping init excluded)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def parse_env(data: bytes, sep: bytes = b"\0") -> dict[str, str]:
    pairs = (item.decode().partition("=") for item in data.split(sep) if item)
    return {name: value for name, _, value in pairs}


async def wait_for_file(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        await asyncio.sleep(0.02)
    return path.read_text()


class RunnerTest(unittest.IsolatedAsyncioTestCase):
    maxDiff = None

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-runner-test-")
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)
        self.out = self.tmp / "out"
        self.out.mkdir()
        self.out.chmod(0o777)       # the skill runs as nobody when the tests run as root
        self.run_dir = self.tmp / "state" / "runs"
        self.runner = self.make_runner()

    def make_runner(self, **kwargs) -> Runner:
        kwargs.setdefault("environ", {"PATH": os.environ["PATH"]})
        return Runner(repo_root=REPO, run_dir=self.run_dir, kill_grace=GRACE, **kwargs)

    def skill(self, name: str, **kwargs) -> Skill:
        """fixture_skill(NAME), granted `- write: <self.out>` (where the tests read back what it did)."""
        return fixture_skill(name, write=(str(self.out),), **kwargs)

    def echoed(self, name: str) -> bytes:
        return (self.out / name).read_bytes()

    def echoed_params(self) -> dict[str, bytes]:
        return {p.name[len("env."):]: p.read_bytes() for p in self.out.glob("env.*")}

    def assert_no_runs_left(self):
        self.assertEqual(self.runner.running, 0)
        self.assertEqual(os.listdir(self.run_dir), [], "a run directory was left behind")

    # Parameters

    async def test_parameters_reach_stdin_and_environment(self):
        params = {"out_dir": str(self.out), "count": 3, "ratio": 2.5, "flag": True, "off": False,
                  "nothing": None, "obj": {"a": [1, "é"]}, "list": [1, 2], "weird-key.x": "v", "ünï": "u"}
        result = await self.runner.execute(self.skill("echo_back"), params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(results.of_run(result), {"success": True, "echoed": True})
        text = json.dumps(params, ensure_ascii=False).encode()
        self.assertEqual(self.echoed("stdin"), text)
        self.assertEqual(self.echoed_params(), {
            "IAS_PARAMS": text, "IAS_PARAM_OUT_DIR": str(self.out).encode(), "IAS_PARAM_COUNT": b"3",
            "IAS_PARAM_RATIO": b"2.5", "IAS_PARAM_FLAG": b"true", "IAS_PARAM_OFF": b"false",
            "IAS_PARAM_NOTHING": b"null", "IAS_PARAM_OBJ": '{"a":[1,"é"]}'.encode(),
            "IAS_PARAM_LIST": b"[1,2]", "IAS_PARAM_WEIRD_KEY_X": b"v", "IAS_PARAM__N_": b"u"})

    async def test_injection_corpus_arrives_as_data(self):
        marker = Path(f"/tmp/ias_pwned_{uuid.uuid4().hex}")
        self.addCleanup(lambda: marker.unlink(missing_ok=True))
        corpus = [
            f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"' ; touch {marker} ; '",
            f'" ; touch {marker} ; "', "'\"", "a\nb\n", f"\n touch {marker}\n rm -rf /nonexistent_ias",
            "${IFS}$HOME", "-e", "--", "%s%n%x", "\\x41\\0", "\t\r\x1b[31mred", "汉字 émoji 🎉 \u202e",
            f"| touch {marker}", f"&& touch {marker}", f"> {marker}", "*", "",
        ]
        params = {"out_dir": str(self.out)}
        params.update((f"p{i}", value) for i, value in enumerate(corpus))
        params[f"key; touch {marker}"] = "k"
        result = await self.runner.execute(self.skill("echo_back"), params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        text = json.dumps(params, ensure_ascii=False)
        self.assertEqual(self.echoed("stdin"), text.encode())
        self.assertEqual(json.loads(self.echoed("stdin")), params)
        echoed = self.echoed_params()
        self.assertEqual(echoed["IAS_PARAMS"], text.encode())
        for i, value in enumerate(corpus):
            self.assertEqual(echoed[f"IAS_PARAM_P{i}"], value.encode(), f"parameter p{i}")
        self.assertEqual(echoed["IAS_PARAM_KEY__TOUCH__TMP_IAS_PWNED_" + marker.name[len("ias_pwned_"):].upper()], b"k")
        self.assertFalse(marker.exists(), "a parameter was executed")

    async def test_values_the_environment_cannot_carry_stay_on_stdin(self):
        big = "x" * 1_000_000 + "汉"
        params = {"out_dir": str(self.out), "big": big, "nul": "a\0b", "lone": "\ud800",
                  "edge_ok": "y" * ENV_VALUE_MAX, "edge_over": "y" * (ENV_VALUE_MAX + 1),
                  "a-b": "1", "a_b": "2", "small": "s"}
        result = await self.runner.execute(self.skill("echo_back"), params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        stdin = self.echoed("stdin")
        self.assertEqual(stdin, json.dumps(params).encode())   # a lone surrogate forces ASCII escapes
        self.assertEqual(json.loads(stdin), params)
        echoed = self.echoed_params()
        self.assertEqual(set(echoed), {"IAS_PARAM_OUT_DIR", "IAS_PARAM_EDGE_OK", "IAS_PARAM_SMALL"})
        self.assertEqual(echoed["IAS_PARAM_EDGE_OK"], b"y" * ENV_VALUE_MAX)

    async def test_parameter_variables_stay_under_the_total_cap(self):
        params = {"out_dir": str(self.out)}
        params.update((f"p{i}", chr(ord("a") + i % 26) * 60_000) for i in range(40))   # 2.4 MB > ARG_MAX
        result = await self.runner.execute(self.skill("echo_back"), params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(self.echoed("stdin"), json.dumps(params).encode())
        echoed = self.echoed_params()
        self.assertNotIn("IAS_PARAMS", echoed)
        carried = [name for name in echoed if name != "IAS_PARAM_OUT_DIR"]
        self.assertTrue(0 < len(carried) < 40, len(carried))
        self.assertLessEqual(sum(map(len, echoed.values())), ENV_TOTAL_MAX)
        for name in carried:
            self.assertEqual(echoed[name], params[name[len("IAS_PARAM_"):].lower()].encode())

    async def test_big_stdin_is_written_while_output_is_read(self):
        params = {"mode": "cat_stdin", "blob": "汉" * 300_000}   # 900 KB echoed back through a 64 KiB pipe
        result = await asyncio.wait_for(self.runner.execute(self.skill("outputs"), params), 10)
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(result.stdout, json.dumps(params, ensure_ascii=False))
        self.assertFalse(result.overflowed)

    async def test_script_need_not_read_stdin(self):
        params = {"mode": "ignore_stdin", "blob": "z" * 2_000_000}
        result = await asyncio.wait_for(self.runner.execute(self.skill("outputs"), params), 10)
        self.assertEqual((result.exit_code, result.stdout), (0, "ignored\n"))

    # Environment, HOME, cwd

    async def test_environment_is_built_from_scratch(self):
        environ = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": "sk-test", "NOTIFY_SOCKET": "@ias-notify",
                   "IAS_DATABASE_URL": "postgresql://secret", "QWEATHER_API_KEY": "qw-key",
                   "HOME": "/root", "LANG": "de_DE.UTF-8"}
        self.runner = self.make_runner(environ=environ, python="/opt/py/bin/python3")
        skill = self.skill("echo_back", env=("QWEATHER_API_KEY", "NOT_SET_ANYWHERE", "HOME", "LANG"))
        result = await self.runner.execute(skill, {"out_dir": str(self.out), "q": "1"})
        self.assertEqual(result.exit_code, 0, result.stderr)
        given = parse_env(self.echoed("environ"))   # what bash was started with, exactly
        home = self.echoed("home").decode().splitlines()[0]
        params_text = json.dumps({"out_dir": str(self.out), "q": "1"}, ensure_ascii=False)
        self.assertEqual(given, {
            "PATH": os.environ["PATH"], "LANG": "C.UTF-8", "TZ": "Asia/Shanghai", "HOME": home,
            "IAS_SKILL": "echo_back", "IAS_SKILL_DIR": str(FIXTURES / "echo_back"),
            "IAS_PARAMS": params_text, "IAS_PARAM_OUT_DIR": str(self.out), "IAS_PARAM_Q": "1",
            "IAS_PYTHON": "/opt/py/bin/python3", "IAS_HOME": str(REPO),
            "PYTHONPATH": str(REPO / "resources" / "lib"), "PYTHONDONTWRITEBYTECODE": "1",
            "QWEATHER_API_KEY": "qw-key", "PWD": str(FIXTURES / "echo_back")})    # PWD: bwrap's, the cwd
        seen = parse_env(self.echoed("env0"))   # what a command inside the script sees
        self.assertEqual(set(seen), set(given) | BASH_ADDS)
        for secret in ("OPENAI_API_KEY", "NOTIFY_SOCKET", "IAS_DATABASE_URL"):
            self.assertNotIn(secret, seen)

    async def test_daemon_environment_is_the_default_and_secrets_stay_out(self):
        secrets = {"OPENAI_API_KEY": "sk-test", "NOTIFY_SOCKET": "@ias-notify", "QWEATHER_API_KEY": "qw-key"}
        with mock.patch.dict(os.environ, secrets):
            self.runner = self.make_runner(environ=None)
            result = await self.runner.execute(self.skill("echo_back", env=("QWEATHER_API_KEY",)),
                                           {"out_dir": str(self.out)})
        self.assertEqual(result.exit_code, 0, result.stderr)
        seen = parse_env(self.echoed("env0"))
        self.assertEqual(seen["QWEATHER_API_KEY"], "qw-key")
        self.assertNotIn("OPENAI_API_KEY", seen)
        self.assertNotIn("NOTIFY_SOCKET", seen)
        self.assertEqual(seen["PATH"], os.environ["PATH"])

    async def test_default_path_when_the_daemon_has_none(self):
        self.runner = self.make_runner(environ={})
        await self.runner.execute(self.skill("echo_back"), {"out_dir": str(self.out)})
        self.assertEqual(parse_env(self.echoed("environ"))["PATH"], "/usr/local/bin:/usr/bin:/bin")

    async def test_home_is_private_and_removed_and_cwd_is_the_skill_directory(self):
        result = await self.runner.execute(self.skill("echo_back"), {"out_dir": str(self.out)})
        self.assertEqual(result.exit_code, 0, result.stderr)
        home, mode = self.echoed("home").decode().splitlines()
        self.assertEqual(Path(home).parent, self.run_dir)
        # A tmpfs of the skill's own mount namespace (nobody else sees it); as root the skill runs as nobody,
        # and bwrap cannot give a tmpfs an owner: sticky and open to the sandbox's only user.
        self.assertEqual(mode, "1777" if os.getuid() == 0 else "700")
        self.assertFalse(os.path.exists(home), "HOME (with files in it) was not removed")
        self.assertEqual(stat.S_IMODE(self.run_dir.stat().st_mode), 0o700)
        self.assertEqual(self.echoed("cwd").decode().strip(), str((FIXTURES / "echo_back").resolve()))
        self.assert_no_runs_left()

    # Timeout and shutdown

    async def test_timeout_kills_the_whole_group(self):
        pidfile = self.out / "pids"
        t0 = time.monotonic()
        task = asyncio.create_task(self.runner.execute(self.skill("sleeper"), {"pidfile": str(pidfile)}, timeout=1))
        _pid, _child, home = (await wait_for_file(pidfile)).split()
        pids = with_env(f"IAS_PARAM_PIDFILE={pidfile}")      # bash and its sleeps, as the host sees them
        group = os.getpgid(pids[0])
        result = await task
        elapsed = time.monotonic() - t0
        self.assertTrue(result.timed_out)
        self.assertGreaterEqual(elapsed, 1 + GRACE - 0.05)
        self.assertLess(elapsed, 1 + GRACE + 1.0)
        self.assertEqual(result.exit_code, -signal.SIGKILL)   # bash ignores SIGTERM too
        self.assertEqual(result.timeout, 1.0)
        self.assertEqual(results.of_run(result), {"success": False, "error": "技能执行超时（1s）：sleeper"})
        self.assertEqual(live_in_group(group), [])
        self.assertEqual([pid for pid in pids if running(pid)], [], "the background sleep survived")
        self.assertFalse(os.path.exists(home))
        self.assert_no_runs_left()

    async def test_skill_timeout_applies_when_none_is_given(self):
        skill = self.skill("sleeper", timeout=0.5)
        result = await self.runner.execute(skill, {"pidfile": str(self.out / "pids"), "ignore_term": False})
        self.assertTrue(result.timed_out)
        self.assertEqual(result.exit_code, -signal.SIGTERM)
        self.assertEqual(results.of_run(result)["error"], "技能执行超时（0.5s）：sleeper")

    async def test_kill_all_ends_every_run(self):
        files = [self.out / "a", self.out / "b"]
        tasks = [asyncio.create_task(self.runner.execute(self.skill("sleeper", timeout=60),
                                                     {"pidfile": str(f), "ignore_term": ignore}))
                 for f, ignore in zip(files, (True, False))]
        for f in files:
            await wait_for_file(f)
        pids = [with_env(f"IAS_PARAM_PIDFILE={f}") for f in files]
        groups = [os.getpgid(p[0]) for p in pids]
        self.assertEqual(self.runner.running, 2)
        t0 = time.monotonic()
        await self.runner.kill_all()
        self.assertLess(time.monotonic() - t0, GRACE + 1.0)
        self.assertTrue(all(task.done() for task in tasks))
        stubborn, polite = [task.result() for task in tasks]
        self.assertEqual((stubborn.exit_code, polite.exit_code), (-signal.SIGKILL, -signal.SIGTERM))
        self.assertFalse(stubborn.timed_out or polite.timed_out)
        self.assertEqual(results.of_run(polite)["exit_code"], -signal.SIGTERM)
        for group, members in zip(groups, pids):
            self.assertEqual(live_in_group(group), [])
            self.assertFalse(any(map(running, members)))
        self.assert_no_runs_left()

    async def test_cancelled_run_kills_its_group_and_cleans_up(self):
        pidfile = self.out / "pids"
        task = asyncio.create_task(self.runner.execute(self.skill("sleeper", timeout=60), {"pidfile": str(pidfile)}))
        _pid, _child, home = (await wait_for_file(pidfile)).split()
        pids = with_env(f"IAS_PARAM_PIDFILE={pidfile}")
        group = os.getpgid(pids[0])
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await until(lambda: not live_in_group(group))     # SIGKILL delivered; the child watcher reaps bash
        self.assertEqual(live_in_group(group), [])
        self.assertFalse(any(map(running, pids)))
        self.assertFalse(os.path.exists(home))
        self.assert_no_runs_left()

    async def test_leftover_processes_are_ended_when_the_script_exits(self):
        pidfile = self.out / "pids"
        result = await self.runner.execute(self.skill("outputs"), {"mode": "leftover", "pidfile": str(pidfile)})
        self.assertEqual((result.exit_code, result.stdout), (0, "ok\n"))
        self.assertLess(result.duration, 1.5)
        self.assertEqual(with_env(f"IAS_PARAM_PIDFILE={pidfile}"), [], "the background sleep outlived its run")

    async def test_process_that_leaves_the_group_does_not_outlive_the_run(self):
        pidfile = self.out / "pid"
        marker = f"IAS_PARAM_PIDFILE={pidfile}"
        self.addCleanup(_kill_marked, marker)
        with mock.patch.object(runner_module, "DRAIN_TIMEOUT", 0.3):
            result = await asyncio.wait_for(self.runner.execute(self.skill("escapee"), {"pidfile": str(pidfile)}), 5)
        self.assertEqual((result.exit_code, result.stdout, result.timed_out), (0, "done\n", False))
        self.assertLess(result.duration, 2)
        self.assertEqual(with_env(marker), [], "the setsid child outlived the call (sandboxed: its pid namespace ends)")

    async def test_unconfined_process_that_leaves_the_group_does_not_hang_the_run(self):
        pidfile = self.out / "pid"
        marker = f"IAS_PARAM_PIDFILE={pidfile}"
        self.addCleanup(_kill_marked, marker)
        skill = replace(self.skill("escapee"), sandbox=Policy(unconfined=True))
        with mock.patch.object(runner_module, "DRAIN_TIMEOUT", 0.3):
            result = await asyncio.wait_for(self.runner.execute(skill, {"pidfile": str(pidfile)}), 5)
        self.assertEqual((result.exit_code, result.stdout, result.timed_out), (0, "done\n", False))
        self.assertLess(result.duration, 2)

    # Output

    async def test_output_flood_is_capped_without_growing_memory(self):
        baseline = _reset_peak_rss()
        tag = uuid.uuid4().hex
        result = await self.runner.execute(self.skill("flood"), {"tag": tag})
        growth = _peak_rss() - baseline
        self.assertTrue(result.overflowed)
        self.assertFalse(result.timed_out)
        self.assertLess(result.duration, 5)
        self.assertEqual(len(result.stdout.encode()), OUTPUT_HELD_MAX)
        self.assertGreater(result.output_size, OUTPUT_HELD_MAX)
        self.assertLess(result.output_size, 50_000_000)
        self.assertEqual(results.of_run(result), {"success": False, "error": "技能输出超过上限（1 MiB），已终止：flood",
                                           "truncated": True})
        self.assertEqual(with_env(f"IAS_PARAM_TAG={tag}"), [])
        self.assertLess(growth, 10 * 1024 * 1024, f"peak RSS grew by {growth} bytes")
        self.assert_no_runs_left()

    async def test_large_output_is_truncated_on_a_utf8_boundary(self):
        result = await self.runner.execute(self.skill("outputs"), {"mode": "big_utf8"})
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(result.output_size, 2 + 99_999)
        self.assertEqual(result.stdout, "ab" + "汉" * 33_333)
        self.assertTrue(results.truncated(result))
        self.assertFalse(result.overflowed)
        llm = results.of_run(result)
        self.assertEqual(llm, {"success": True, "output": "ab" + "汉" * ((STDOUT_TO_LLM - 2) // 3), "truncated": True})
        self.assertLessEqual(len(llm["output"].encode()), STDOUT_TO_LLM)

    async def test_results_for_the_model(self):
        cases = {
            "json": {"success": False, "error": "quota exceeded", "extra": [1, 2]},
            "text": {"success": True, "output": "hello 世界\n"},
            "json_without_success": {"success": True, "output": '{"answer": 42}\n'},
            "fail_stderr": {"success": False, "error": "boom: disk full", "exit_code": 3},
            "fail_stdout": {"success": False, "error": "only stdout", "exit_code": 4},
            "fail_long": {"success": False, "error": "e" * ERROR_TAIL, "exit_code": 5},
            "fail_silent": {"success": False, "error": "技能执行失败（退出码 6）：outputs", "exit_code": 6},
        }
        runs = await asyncio.gather(*(self.runner.execute(self.skill("outputs"), {"mode": m}) for m in cases))
        for (mode, expected), result in zip(cases.items(), runs):
            with self.subTest(mode=mode):
                self.assertEqual(results.of_run(result), expected)
                self.assertFalse(result.timed_out or result.overflowed)

    async def test_stderr_keeps_its_tail(self):
        skill = replace(self.skill("outputs"),
                        execute="head -c 200000 /dev/zero | tr '\\0' a >&2; printf END >&2; exit 1")
        result = await self.runner.execute(skill, {})
        self.assertEqual(len(result.stderr), 64 * 1024)
        self.assertTrue(result.stderr.endswith("aaaEND"))
        self.assertEqual(results.of_run(result)["error"], ("a" * ERROR_TAIL + "END")[-ERROR_TAIL:])

    def test_result_edge_cases(self):
        base = dict(skill="s", exit_code=0, stderr="", timed_out=False, overflowed=False, timeout=30.0,
                    duration=0.1, started_at=0.0)
        truncated_json = RunResult(stdout='{"success": true}', output_size=STDOUT_TO_LLM + 1, **base)
        self.assertEqual(results.of_run(truncated_json), {"success": True, "output": '{"success": true}', "truncated": True})
        not_object = RunResult(stdout='[{"success": true}]', output_size=19, **base)
        self.assertEqual(results.of_run(not_object), {"success": True, "output": '[{"success": true}]'})
        timed_out = RunResult(stdout="", output_size=0, **{**base, "timed_out": True, "timeout": 30})
        self.assertEqual(results.of_run(timed_out), {"success": False, "error": "技能执行超时（30s）：s"})

    # Concurrency and failures

    async def test_concurrent_runs_do_not_interfere(self):
        t0 = time.monotonic()
        results = await asyncio.gather(*(self.runner.execute(self.skill("outputs"),
                                                         {"mode": "tag", "tag": f"run{i}", "code": i % 3})
                                         for i in range(8)))
        self.assertLess(time.monotonic() - t0, 8 * 0.3 * 0.6)
        homes = set()
        for i, result in enumerate(results):
            tag, home = result.stdout.split("|")
            self.assertEqual((tag, result.exit_code), (f"run{i}", i % 3))
            homes.add(home)
        self.assertEqual(len(homes), 8)
        self.assert_no_runs_left()

    async def test_spawn_failure_is_a_result(self):
        self.runner = self.make_runner(environ={"PATH": str(self.tmp / "no-bin")})
        result = await self.runner.execute(self.skill("outputs"), {"mode": "text"})
        self.assertEqual(result.exit_code, 127)
        self.assertTrue(result.stderr.startswith("spawn failed: No such file or directory"), result.stderr)
        self.assertEqual(results.of_run(result), {"success": False, "error": result.stderr, "exit_code": 127})
        missing = replace(self.skill("outputs"), directory=str(self.tmp / "gone"))
        result = await self.make_runner().execute(missing, {"mode": "text"})
        self.assertEqual(result.exit_code, 127)
        self.assertIn("spawn failed", result.stderr)
        self.assert_no_runs_left()


def _kill_marked(marker: str) -> None:
    for pid in with_env(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _peak_rss() -> int:
    """Peak resident set size of this process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak_rss() -> int:
    """Reset the peak to the current RSS where the kernel allows it; the peak to measure from."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _peak_rss()


class RecoverTest(unittest.TestCase):
    """At daemon start: leftovers of dead processes' runs are ended and removed, live ones kept."""

    def test_leftovers_of_dead_owners_are_killed_and_removed(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-recover-")
        self.addCleanup(tmp.cleanup)
        runs = Path(tmp.name)
        pid, start = processes.identity()
        dead = runs / f"run-{pid}-{start + 1}-abc"           # same pid, another (gone) process
        live = runs / f"run-{pid}-{start}-def"
        old = runs / "run-k2j4h5g6"                          # no owner in its name
        for directory in (dead, live, old):
            (directory / ".cache").mkdir(parents=True)
        os.chmod(dead / ".cache", 0o500)                    # read-only, as Go's module cache leaves it
        orphan = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "HOME": str(dead)},
                                  start_new_session=True)
        self.addCleanup(orphan.wait)
        self.addCleanup(lambda: orphan.poll() is None and orphan.kill())
        # Popen returns once exec has begun, a moment before the kernel publishes the new environment
        # (/proc/PID/environ reads empty until then): wait for it, as a real leftover long had it.
        deadline = time.monotonic() + 10
        while f"HOME={dead}".encode() not in Path(f"/proc/{orphan.pid}/environ").read_bytes().split(b"\0"):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        self.assertEqual(processes.recover(runs), 2)
        self.assertEqual(orphan.wait(timeout=5), -signal.SIGKILL)
        self.assertEqual(os.listdir(runs), [live.name])
        self.assertEqual(processes.recover(runs / "missing"), 0)


if __name__ == "__main__":
    unittest.main()

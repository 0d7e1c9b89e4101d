"""The execute_shell skill: exit code and both streams, a private working directory, the approved
command text reaching bash byte for byte, output caps, and its own time limit."""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import unittest
from pathlib import Path

from ias import jsonschema as schema, results
from ias.runner import Runner
from ias.skills import load_skill
from tests.support import REPO, SkillsTestCase

SKILL = load_skill(REPO / "resources" / "skills" / "execute_shell", "system")


def process_running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


class ShellSkillTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-shell-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    async def shell(self, command: str, **environ: str) -> dict:
        params = schema.apply_defaults({"command": command}, SKILL.parameters)
        self.assertEqual(schema.validate(params, SKILL.parameters), [])
        runner = Runner(repo_root=REPO, run_dir=self.tmp / "runs", environ={"PATH": os.environ["PATH"], **environ})
        result = await runner.execute(SKILL, params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        llm = results.of_run(result)
        self.assertNotIn("output", llm)          # always one JSON object the runner passes through
        return llm

    async def test_exit_code_and_streams(self):
        ok = await self.shell("echo hello; echo 你好")
        self.assertEqual((ok["success"], ok["exit_code"], ok["stdout"], ok["stderr"], ok["truncated"]),
                         (True, 0, "hello\n你好\n", "", False))
        bad = await self.shell("echo out; echo err >&2; exit 3")
        self.assertEqual((bad["success"], bad["exit_code"], bad["stdout"], bad["stderr"]), (False, 3, "out\n", "err\n"))
        self.assertIn("status 3", bad["error"])

    async def test_runs_in_the_private_run_directory(self):
        result = await self.shell('pwd; echo "$HOME"; stat -c %a .; ls -A | wc -l; cat /dev/stdin | wc -c')
        cwd, home, mode, entries, stdin_bytes = result["stdout"].splitlines()
        self.assertEqual(cwd, home)
        self.assertEqual(Path(cwd).parent, self.tmp / "runs")
        self.assertNotEqual(cwd, SKILL.directory)
        self.assertEqual((mode, entries, stdin_bytes), ("700", "0", "0"))   # fresh, 0700, stdin empty
        self.assertFalse(Path(cwd).exists())                                # removed after the run

    async def test_command_text_reaches_bash_byte_exact(self):
        # It is a shell skill: '; echo pwned' is simply part of the command the owner approved.
        # What matters is that the text arrives unchanged, as one argument, never re-parsed.
        command = 'printf %s "$BASH_EXECUTION_STRING" # \'; echo pwned "$(id)" `x` \\ 中文\t$HOME\n# 第二行'
        result = await self.shell(command)
        self.assertTrue(result["success"], result)
        self.assertEqual(result["stdout"], command)
        quoted = await self.shell("echo '; echo pwned'")
        self.assertEqual(quoted["stdout"], "; echo pwned\n")
        dash = await self.shell("-n")                 # a command, not an option to bash
        self.assertEqual(dash["exit_code"], 127)
        self.assertIn("-n: command not found", dash["stderr"])

    async def test_output_is_capped(self):
        result = await self.shell("head -c 300000 /dev/zero | tr '\\0' a; echo; echo END; "
                                  "head -c 100000 /dev/zero | tr '\\0' e >&2")
        self.assertTrue(result["success"])
        self.assertTrue(result["truncated"])
        self.assertLessEqual(len(result["stdout"]), 25 * 1024)
        self.assertLessEqual(len(result["stderr"]), 9 * 1024)
        self.assertTrue(result["stdout"].startswith("aaaa"))
        self.assertTrue(result["stdout"].endswith("a\nEND\n"))       # the start and the end are kept
        self.assertRegex(result["stdout"], r"…\[\d+ bytes omitted\]…")
        binary = await self.shell("head -c 200000 /dev/zero")      # NULs escape to 6 bytes each in JSON
        self.assertTrue(binary["truncated"])
        self.assertTrue(binary["stdout"].startswith("\0"))

    async def test_inner_time_limit(self):
        started = time.monotonic()
        result = await self.shell("echo started; sleep 30 & echo $!; wait", IAS_SHELL_TIMEOUT="1")
        self.assertLess(time.monotonic() - started, 8)
        self.assertFalse(result["success"])
        self.assertTrue(result["timed_out"])
        self.assertIn("timed out after 1 s", result["error"])
        first, pid = result["stdout"].splitlines()
        self.assertEqual(first, "started")
        self.assertFalse(process_running(int(pid)))           # the whole group was ended

    async def test_leftover_background_process_is_ended(self):
        result = await self.shell("sleep 30 >/dev/null 2>&1 & echo $!")
        self.assertTrue(result["success"], result)
        self.assertFalse(process_running(int(result["stdout"])))

    async def test_a_cancelled_call_ends_the_command_too(self):
        """A stop word (or a turn's end) cancels the call: the command, in a session of its own, goes with it."""
        pidfile = self.tmp / "pid"
        params = schema.apply_defaults({"command": f"echo $$ > {pidfile}; sleep 30"}, SKILL.parameters)
        runner = Runner(repo_root=REPO, run_dir=self.tmp / "runs", environ={"PATH": os.environ["PATH"]})
        call = asyncio.create_task(runner.execute(SKILL, params))
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            self.assertLess(time.monotonic(), deadline, "the command never started")
            await asyncio.sleep(0.02)
        pid = int(pidfile.read_text())
        call.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await call
        deadline = time.monotonic() + 2
        while process_running(pid):
            self.assertLess(time.monotonic(), deadline, "the command outlived its cancelled call")
            await asyncio.sleep(0.02)


class ShellGateTest(SkillsTestCase):
    async def test_runs_exactly_what_the_owner_confirmed(self):
        marker = self.tmp / "ran"
        command = f"echo '; echo pwned'; touch {marker}"
        task = asyncio.create_task(self.gate.call("owner", "execute_shell", {"command": command}, self.owner.notify))
        code = await self.owner.code()
        self.assertFalse(marker.exists())
        (message,) = self.owner.messages
        self.assertIn(f"\n· 命令：{command}\n", message)
        await self.approvals.redeem("owner", code)
        result = await asyncio.wait_for(task, 30)
        self.assertEqual((result["success"], result["exit_code"], result["stdout"]), (True, 0, "; echo pwned\n"))
        self.assertTrue(marker.exists())

    async def test_invalid_calls_are_rejected_before_approval(self):
        for params in ({}, {"command": ""}, {"command": 7}, {"command": "ls", "cwd": "/"}):
            with self.subTest(params=params):
                result = await self.gate.call("owner", "execute_shell", params, self.owner.notify)
                self.assertFalse(result["success"])
                self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.owner.messages, [])


if __name__ == "__main__":
    unittest.main()

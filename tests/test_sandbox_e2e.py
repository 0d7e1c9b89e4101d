"""Containment end to end (SPEC 10): probe_escape through `ias run`, `--once`, the daemon and an MCP server,
with iAs run as root (skills run as nobody) and as a normal user (iAs itself run as nobody).

Each class works in a fresh copy of the repository (tests/e2e_support.py) with the probe skills
installed into its `skills/`; the probe is told the copy's real secret key, data directory,
embedded cluster socket, another skill's SKILL.md, the daemon's pid and a local TCP server, and
every attempt must fail while the allowed work succeeds (see tests/test_sandbox.py).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import unittest
import uuid
from pathlib import Path

from ias.pgcluster import PORT
from tests.e2e_support import Copy, EchoLLM, llm_env
from tests.support import FIXTURES, slow, with_env
from tests.test_sandbox import LocalServer, assert_contained

PROBES = FIXTURES / "sandbox"
NOBODY = 65534
MCP_SKILL = """# Probe server

The probe as an MCP server's tool (tests/fixtures/sandbox/probe_escape/probe.py --mcp).

## MCP
$IAS_PYTHON probe.py --mcp

## Risk Level
Low
"""


SAVE_NOTE = """# Save note

A home-made Low skill: saves a note to the file it is given.

## Risk Level
Low

## Parameters
```json
{"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
 "required": ["path", "text"]}
```

## Execute
```bash
printf '%s' "$IAS_PARAM_TEXT" > "$IAS_PARAM_PATH" && echo saved
```
"""


def install_probes(copy: Copy) -> None:
    """probe_escape, probe_network and probe_mcp (the same probe as an MCP tool) into the copy's skills/."""
    for name in ("probe_escape", "probe_network"):
        shutil.copytree(PROBES / name, copy.root / "skills" / name)
    server = copy.root / "skills" / "probe_mcp"
    server.mkdir()
    shutil.copy2(PROBES / "probe_escape" / "probe.py", server / "probe.py")
    (server / "SKILL.md").write_text(MCP_SKILL, encoding="utf-8")
    (copy.root / "skills" / "save_note").mkdir()
    (copy.root / "skills" / "save_note" / "SKILL.md").write_text(SAVE_NOTE, encoding="utf-8")


def as_nobody(copy: Copy) -> list[str]:
    """A prefix that runs a command as nobody (uid 65534, no groups, no capabilities).

    This machine's Python lives below /root (0700), which a normal user's Python never does: the
    command gets a mount namespace of its own where that one directory is a 0755 tmpfs holding
    only the way to the Python. Nothing else changes; iAs then runs bwrap as nobody.
    """
    python = Path(os.path.realpath(os.sys.executable))
    blocked = next((p for p in reversed(python.parents) if p != Path("/") and not p.stat().st_mode & stat.S_IXOTH),
                   None)
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all", "--"]
    if blocked is None:
        return drop
    keep = blocked / python.relative_to(blocked).parts[0]
    aside = Path(tempfile.mkdtemp(prefix="ias-e2e-python-"))
    os.chmod(aside, 0o755)
    script = ('set -e; mount --bind "$1" "$2"; mount -t tmpfs -o mode=0755 tmpfs "$3"; mkdir -p "$1"; '
              'mount --bind "$2" "$1"; shift 3; exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(keep), str(aside),
            str(blocked), *drop]


@slow
class ProbeEndToEnd:
    """The probe through every entry point; the subclasses choose who runs iAs."""
    copy: Copy
    expected_uid: int

    @classmethod
    def setUpClass(cls):
        cls.copy = Copy()
        install_probes(cls.copy)
        cls.llm = EchoLLM().__enter__()
        cls.server = LocalServer()
        cls.prepare()

    @classmethod
    def prepare(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        cls.copy.remove()
        cls.llm.__exit__(None, None, None)
        cls.server.close()

    def setUp(self):
        self.marker = f"ias-probe-{uuid.uuid4().hex}"
        self.addCleanup(self.copy.reset)
        self.addCleanup(self._clean)
        owner = Path(os.path.expanduser("~")) / f".{self.marker}"
        owner.write_text("private")
        self.addCleanup(owner.unlink, missing_ok=True)
        first = self.copy.ias("skills")            # creates var/, the key comes with the first store use
        self.assertEqual(first.returncode, 0, first.describe())
        self.params = {
            "key_file": str(self.copy.root / "var" / "secret.key"), "data_dir": str(self.copy.root / "var"),
            "repo": str(self.copy.root), "daemon_pid": os.getpid(), "server_port": self.server.port,
            "other_skill": str(self.copy.root / "resources" / "skills" / "execute_shell" / "SKILL.md"),
            "db_socket": str(self.copy.pgdata / f".s.PGSQL.{PORT}"), "db_port": PORT, "marker": self.marker,
            "owner_file": str(owner)}

    def _clean(self):
        for pid in with_env(f"IAS_PROBE_SLEEPER={self.marker}"):
            os.kill(pid, 9)
        for path in (Path("/var/tmp") / self.marker, Path("/tmp") / self.marker, self.copy.root / self.marker):
            path.unlink(missing_ok=True)

    def check(self, answer: dict, daemon_running: bool = False) -> None:
        assert_contained(self, {**answer, "uid": NOBODY}, self.marker)    # the uid is checked below
        self.assertEqual(answer["uid"], self.expected_uid)
        self.assertTrue(self.copy.pgdata.exists(), "the probe must have had a real cluster to try")
        self.assertTrue((self.copy.root / "var" / "secret.key").exists(), "and a real key")
        self.assertFalse((self.copy.root / self.marker).exists())
        if not daemon_running:          # whose MCP server has a run directory while it runs
            self.assertEqual(list((self.copy.root / "var" / "runs").iterdir()), [], "a run directory was left")

    def test_ias_run(self):
        done = self.copy.ias("run", "probe_escape", json.dumps(self.params))
        self.assertEqual(done.returncode, 0, done.describe())
        self.check(json.loads(done.stdout))

    def test_once(self):
        self.llm.tool = ("probe_escape", self.params)
        try:
            done = self.copy.ias("--once", "probe", env=llm_env(self.llm))
        finally:
            self.llm.tool = None
        self.assertEqual(done.returncode, 0, done.describe())
        self.check(self.tool_result())

    def test_daemon(self):
        daemon = self.copy.daemon(env=llm_env(self.llm))
        self.assertEqual(daemon.reply("hello"), "回声：hello", daemon.stderr())
        self.assertIn("sandbox: full", daemon.stderr())
        self.llm.tool = ("probe_escape", {**self.params, "daemon_pid": daemon.pid})
        try:
            self.assertEqual(daemon.reply("probe"), "回声：probe", daemon.stderr())
        finally:
            self.llm.tool = None
        self.check(self.tool_result(), daemon_running=True)
        self.assertEqual(daemon.terminate(), 0, daemon.stderr())
        self.assertEqual(list((self.copy.root / "var" / "runs").iterdir()), [], "a run directory was left")

    def test_mcp_server(self):
        listed = self.copy.ias("skills", "check")
        self.assertIn("mcp server probe_mcp: 1 tools: probe_mcp__probe", listed.stderr, listed.describe())
        done = self.copy.ias("run", "probe_mcp__probe", json.dumps(self.params))
        self.assertEqual(done.returncode, 0, done.describe())
        self.check(json.loads(json.loads(done.stdout)["output"]))

    def test_an_injected_note_cannot_rerate_execute_shell(self):
        """The issue's chain: a page tells the model to "save a note" over execute_shell's SKILL.md."""
        target = self.copy.root / "resources" / "skills" / "execute_shell" / "SKILL.md"
        original = target.read_bytes()
        doctored = original.decode().replace("## Risk Level\nHigh", "## Risk Level\nLow")
        self.assertNotEqual(doctored.encode(), original)
        self.llm.tool = ("save_note", {"path": str(target), "text": doctored})
        try:
            done = self.copy.ias("--once", "按搜索结果保存笔记", env=llm_env(self.llm))
        finally:
            self.llm.tool = None
        self.assertEqual(done.returncode, 0, done.describe())
        result = self.tool_result()
        self.assertFalse(result["success"], result)
        self.assertEqual(target.read_bytes(), original)
        rows = {r["name"]: r for r in json.loads(self.copy.ias("skills", "--json").stdout)}
        self.assertEqual(rows["execute_shell"]["risk"], "high")
        verify = self.copy.ias("audit", "--verify")
        self.assertEqual(verify.returncode, 0, verify.describe())
        self.assertIn("audit log: chain intact", verify.stdout)

    def test_network_once_declared(self):
        done = self.copy.ias("run", "probe_network", json.dumps({"server_port": self.server.port}))
        self.assertEqual(done.returncode, 0, done.describe())
        self.assertEqual(json.loads(done.stdout), {"success": True, "reply": "hi"})

    def test_doctor_names_the_level(self):
        done = self.copy.ias("doctor", env=llm_env(self.llm))
        self.assertIn("ok    sandbox: full", done.stdout, done.describe())
        self.assertIn("warn  unconfined: run outside the sandbox, each call approved by code: execute_shell",
                      done.stdout)

    def tool_result(self) -> dict:
        """The probe's answer as the model got it (the tool message of the last request)."""
        for request in reversed(self.llm.requests):
            tools = [m for m in request["messages"] if m["role"] == "tool"]
            if tools:
                return json.loads(tools[-1]["content"])
        raise AssertionError("the model never got a tool result")


class AsRootTest(ProbeEndToEnd, unittest.TestCase):
    """iAs as root (this suite's user): skills and the MCP server run as nobody."""
    expected_uid = NOBODY

    @classmethod
    def prepare(cls):
        if os.getuid() != 0:
            raise AssertionError("the e2e sandbox suite runs as root (and then as nobody in AsUserTest)")


class AsUserTest(ProbeEndToEnd, unittest.TestCase):
    """iAs itself run as a normal user (nobody): skills run as that user inside a user namespace."""
    expected_uid = NOBODY

    @classmethod
    def prepare(cls):
        for top, dirs, files in os.walk(cls.copy.root):     # a user's own installation
            for name in [*dirs, *files]:
                os.chown(os.path.join(top, name), NOBODY, NOBODY, follow_symlinks=False)
        os.chown(cls.copy.root, NOBODY, NOBODY)
        cls.copy.prefix = as_nobody(cls.copy)

if __name__ == "__main__":
    unittest.main()

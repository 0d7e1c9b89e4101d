"""Containment (SPEC 10) from the attacker's side: a Low skill that tries every forbidden reach gets none.

The runner-level tests run tests/fixtures/sandbox/probe_escape through the daemon's runner
(`app.make_runner`) against a data directory with a secret key, the suite's real PostgreSQL,
this test process as "the daemon", and a local TCP server; `tests/test_sandbox_e2e.py` does
the same through `ias run`, `--once`, the daemon and an MCP server, as root and as a normal user.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from dataclasses import replace
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from ias import sandbox as sandbox_module
from ias.app import make_runner
from ias.config import Config
from ias.errors import SkillError
from ias.registry import load_registry
from ias.sandbox import Policy, Sandbox
from ias.skills import load_skill, parse_skill
from tests.support import FIXTURES, REPO, server_dsn, with_env

PROBES = FIXTURES / "sandbox"
FORBIDDEN_EVERYWHERE = {"write_var_tmp", "read_shadow", "write_own_skill", "write_own_directory", "write_root",
                        "read_key", "list_data_dir", "write_data_dir", "write_config", "write_repo", "list_repo",
                        "write_other_skill", "read_other_skill", "daemon_environ", "daemon_mem", "signal_daemon",
                        "signal_daemon_winch", "db_socket", "db_tcp", "tcp_local_server", "write_tmp_of_host",
                        "read_owner_home", "list_owner_home"}
ALLOWED = {"write_home": "ok", "write_tmp": "ok", "python_with_helper": "ok", "read_own_directory": "ok",
           "dev_urandom": "ok"}


class LocalServer:
    """A TCP server on 127.0.0.1 that answers each connection with `hi` (and counts them)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.sendall(b"hi")

    def close(self):
        self.sock.close()


def database_target() -> tuple[str | None, int]:
    """The suite's PostgreSQL as a skill would try it: its unix socket path (if any) and its port."""
    info = conninfo_to_dict(server_dsn())
    port = int(info.get("port") or 5432)
    host = info.get("host") or "/var/run/postgresql"
    return (os.path.join(host, f".s.PGSQL.{port}") if host.startswith("/") else None), port


def owner_file(test: unittest.TestCase, marker: str) -> Path:
    """A file in the home directory of the user the tests run as (the owner's home, to a skill)."""
    path = Path(os.path.expanduser("~")) / f".{marker}"
    path.write_text("private")
    test.addCleanup(path.unlink, missing_ok=True)
    return path


def probe_params(data_dir: Path, key: Path, repo: Path, server: LocalServer, marker: str, owner: Path,
                 daemon_pid: int | None = None) -> dict:
    socket_path, port = database_target()
    params = {"key_file": str(key), "data_dir": str(data_dir), "repo": str(repo),
              "other_skill": str(repo / "resources" / "skills" / "execute_shell" / "SKILL.md"),
              "daemon_pid": daemon_pid or os.getpid(), "db_port": port, "server_port": server.port, "marker": marker,
              "owner_file": str(owner)}
    if socket_path:
        params["db_socket"] = socket_path
    return params


def assert_contained(test: unittest.TestCase, answer: dict, marker: str, expected: set[str] = FORBIDDEN_EVERYWHERE):
    """Every forbidden reach failed, every allowed piece of work succeeded, nothing outlived the call."""
    test.assertEqual(answer["reached"], [], f"reached from inside the sandbox: {answer}")
    test.assertEqual(set(answer["blocked"]), expected)
    test.assertEqual(answer["allowed"], ALLOWED)
    test.assertEqual(with_env(f"IAS_PROBE_SLEEPER={marker}"), [], "a setsid -f sleeper outlived the call")
    test.assertFalse(os.path.exists(f"/var/tmp/{marker}"))
    test.assertFalse(os.path.exists(f"/tmp/{marker}"), "the private /tmp was the host's")
    if os.getuid() == 0:
        test.assertEqual(answer["uid"], 65534, "a skill of a root iAs must run as nobody")


class ProbeTest(unittest.IsolatedAsyncioTestCase):
    """probe_escape through the daemon's runner: nothing forbidden reached, the allowed work done."""

    def setUp(self):
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-test-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        self.data_dir = tmp / "var"
        self.data_dir.mkdir(mode=0o700)
        self.key = self.data_dir / "secret.key"
        self.key.write_bytes(os.urandom(32))
        self.key.chmod(0o600)
        self.config = Config(data_dir=self.data_dir, skills_dir=PROBES, environ={"PATH": os.environ["PATH"]})
        self.runner = make_runner(self.config)
        self.server = LocalServer()
        self.addCleanup(self.server.close)
        self.marker = f"ias-probe-{uuid.uuid4().hex}"
        self.addCleanup(self._clean)

    def _clean(self):
        for pid in with_env(f"IAS_PROBE_SLEEPER={self.marker}"):
            os.kill(pid, 9)
        for path in (f"/var/tmp/{self.marker}", f"/tmp/{self.marker}", REPO / self.marker):
            Path(path).unlink(missing_ok=True)

    async def probe(self, skill=None) -> dict:
        skill = skill or load_skill(PROBES / "probe_escape")
        params = probe_params(self.data_dir, self.key, REPO, self.server, self.marker, owner_file(self, self.marker))
        result = await self.runner.execute(skill, params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        return json.loads(result.stdout)

    def test_this_machine_reaches_the_full_level(self):
        level = self.runner.sandbox.level()
        self.assertTrue(level.full, f"CI runs with the full sandbox level; here: {level} ({level.missing})")

    async def test_every_forbidden_reach_fails_and_the_allowed_work_succeeds(self):
        before = self.server.connections
        assert_contained(self, await self.probe(), self.marker)
        self.assertEqual(self.server.connections, before, "the local server was reached without `- network`")
        self.assertFalse((REPO / self.marker).exists())
        self.assertEqual(os.listdir(self.runner.run_dir), [], "the run directory was left behind")

    async def test_a_declared_network_reaches_the_local_server(self):
        result = await self.runner.execute(load_skill(PROBES / "probe_network"), {"server_port": self.server.port})
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(json.loads(result.stdout), {"success": True, "reply": "hi"})

    async def test_declared_paths_are_granted_and_nothing_more(self):
        outside = Path(tempfile.mkdtemp(prefix="ias-sandbox-grant-"))
        self.addCleanup(shutil.rmtree, outside, True)
        (outside / "in").mkdir()
        (outside / "in" / "data").write_text("readable")
        (outside / "out").mkdir()
        (outside / "out").chmod(0o777)          # the owner makes a granted directory writable for the sandbox user
        skill = replace(load_skill(PROBES / "probe_escape"),
                        execute='cat "$G/in/data"; echo written > "$G/out/file"; '
                                'echo no > "$G/in/data" 2>/dev/null || echo " read-only"; ls "$G"',
                        env=("G",), sandbox=Policy(read=(str(outside / "in"),), write=(str(outside / "out"),)))
        runner = make_runner(replace(self.config, environ={"PATH": os.environ["PATH"], "G": str(outside)}))
        result = await runner.execute(skill, {})
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(result.stdout, "readable read-only\nin\nout\n")      # the granted dirs only, not `outside`'s
        self.assertEqual((outside / "out" / "file").read_text(), "written\n")
        self.assertEqual((outside / "in" / "data").read_text(), "readable")

    async def test_a_path_inside_the_data_directory_is_refused_at_run_time(self):
        skill = replace(load_skill(PROBES / "probe_escape"), sandbox=Policy(read=(str(self.data_dir),)))
        result = await self.runner.execute(skill, {})
        self.assertEqual(result.exit_code, 127)
        self.assertIn("overlaps the data directory", result.stderr)

    async def test_unconfined_runs_as_the_daemons_user_outside(self):
        skill = replace(load_skill(PROBES / "probe_escape"), risk="high", execute="id -u; ls -d /work /root",
                        sandbox=Policy(unconfined=True))
        result = await self.runner.execute(skill, {})
        self.assertEqual(result.stdout.split()[0], str(os.getuid()))


class SandboxSectionTest(unittest.TestCase):
    """`## Sandbox` parsed and linted like every section, with file and line."""

    def parse(self, sandbox: str, risk: str = "Low", mcp: bool = False):
        self.line = 12 if mcp else 19      # of the first line under ## Sandbox
        body = "## MCP\n$IAS_PYTHON server.py\n" if mcp else \
            '## Parameters\n```json\n{"type": "object"}\n```\n\n## Execute\n```bash\ntrue\n```\n'
        text = f"# T\n\nD.\n\n## Risk Level\n{risk}\n\n{body}\n## Sandbox\n{sandbox}"
        return parse_skill(Path("/srv/skills/t/SKILL.md"), text)

    def test_permissions(self):
        skill = self.parse("- network\n- read: /srv/music\n- write: `~/exports`\n")
        self.assertEqual(skill.sandbox, Policy(network=True, read=("/srv/music",), write=("~/exports",)))
        self.assertEqual(skill.sandbox.describe(), "network, read: /srv/music, write: ~/exports")
        self.assertEqual(self.parse("- unconfined\n", risk="High").sandbox, Policy(unconfined=True))
        self.assertEqual(self.parse("- network\n", mcp=True).sandbox, Policy(network=True))
        self.assertEqual(parse_skill(Path("/srv/skills/t/SKILL.md"), "# T\n\nD.\n\n## Risk Level\nLow\n\n"
                                     '## Parameters\n```json\n{"type": "object"}\n```\n\n## Execute\n```bash\n'
                                     "true\n```\n").sandbox, Policy())

    def test_problems_name_file_and_line(self):
        cases = {
            "- internet\n": (0, "a '## Sandbox' line is one of"),
            "- read: relative/path\n": (0, "'read:' needs a PATH that is absolute or starts with ~/"),
            "- write: /srv/../etc\n": (0, "'write:' PATH may not contain '..'"),
            "- unconfined\n": (0, "'- unconfined' is for a High skill only"),
            f"- network\n- read: {REPO / 'resources'}\n": (1, "sandbox path"),
            "- write: /srv/skills/other\n": (0, "sandbox path /srv/skills/other may not overlap"),
        }
        for text, (offset, expected) in cases.items():
            with self.subTest(text=text), self.assertRaises(SkillError) as caught:
                self.parse(text)
            self.assertIn(f"/srv/skills/t/SKILL.md:{self.line + offset}: {expected}", "\n".join(caught.exception.problems))
        with self.assertRaises(SkillError) as caught:
            self.parse("- unconfined\n", risk="High", mcp=True)
        self.assertIn("an MCP server always runs in the sandbox", caught.exception.problems[0])

    def test_shipped_skills_declare_what_they_need(self):
        reg = load_registry(REPO / "resources" / "skills", REPO / "skills")
        declared = {s.name: s.sandbox.describe() for s in reg if not s.builtin}
        self.assertEqual(declared, {"bar_chart": "default", "email": "network", "execute_shell": "unconfined",
                                    "get_current_datetime": "default",
                                    "query_qweather": "network", "query_weather": "network",
                                    "search_tavily": "network", "search_web": "network", "start_pc": "network"})

    def test_the_policy_survives_the_spec_cache(self):
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-cache-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        shutil.copytree(PROBES, tmp / "skills")
        with (tmp / "skills" / "probe_network" / "SKILL.md").open("a") as f:
            f.write("- read: /srv/music\n")
        first = load_registry(None, tmp / "skills", cache=tmp / "cache.json")
        second = load_registry(None, tmp / "skills", cache=tmp / "cache.json")
        self.assertEqual(second.get("probe_network").sandbox, Policy(network=True, read=("/srv/music",)))
        self.assertEqual({s.name: s.sandbox for s in first}, {s.name: s.sandbox for s in second})
        self.assertIn('/probe_network", ["network", "read: /srv/music"]]', (tmp / "cache.json").read_text())

    def test_skills_listing_shows_each_sandbox(self):
        env = {**os.environ, "IAS_SKILLS_DIR": str(PROBES), "IAS_DATA_DIR": tempfile.mkdtemp(prefix="ias-sbx-")}
        self.addCleanup(shutil.rmtree, env["IAS_DATA_DIR"], True)
        listing = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills", "--json"], env=env,
                                 capture_output=True, text=True, timeout=60)
        rows = {r["name"]: r["sandbox"] for r in json.loads(listing.stdout)}
        self.assertEqual((rows["probe_network"], rows["probe_escape"], rows["execute_shell"], rows["find_skills"]),
                         ("network", "default", "unconfined", "in-process"))
        table = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills"], env=env, capture_output=True,
                               text=True, timeout=60).stdout
        self.assertRegex(table, r"\nprobe_network +user +low +30s +network\n")
        shown = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills", "show", "execute_shell"], env=env,
                               capture_output=True, text=True, timeout=60).stdout
        self.assertEqual(json.loads(shown)["sandbox"], "unconfined")


class LevelTest(unittest.TestCase):
    """Below the full level, user skills and MCP servers do not load unless allowed; the level is named."""

    def setUp(self):
        self.saved = dict(sandbox_module._levels)
        self.addCleanup(lambda: (sandbox_module._levels.clear(), sandbox_module._levels.update(self.saved),
                                 sandbox_module._probing.clear()))

    def test_without_bwrap_the_level_is_none_and_says_why(self):
        box = Sandbox(repo_root=REPO, data_dir="/nonexistent", user="nobody")
        box._bwrap = None
        sandbox_module._levels.clear()
        level = box.level()
        self.assertEqual((str(level), level.missing), ("none", "bubblewrap (bwrap) is not installed"))

    def test_a_probe_begun_early_runs_meanwhile_and_is_the_one_level_waits_for(self):
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-probe-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        fake = tmp / "bwrap"            # stands in for bwrap: says it started, then fails as a host without it would
        fake.write_text(f"#!/bin/sh\necho started >> {tmp}/started\necho 'no user namespaces' >&2\nexit 1\n")
        fake.chmod(0o755)
        box = Sandbox(repo_root=REPO, data_dir="/nonexistent", user="nobody")
        box._bwrap = str(fake)
        sandbox_module._levels.clear()
        box.begin_probe()
        box.begin_probe()               # begun once
        deadline = time.monotonic() + 10
        while not (tmp / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue((tmp / "started").exists(), "the probe did not run before level() was asked")
        level = box.level()
        self.assertEqual((str(level), level.missing), ("none", "bwrap fails here: no user namespaces"))
        box.level()
        self.assertEqual((tmp / "started").read_text(), "started\n")
        self.assertEqual(sandbox_module._probing, {})

    def test_a_root_ias_needs_an_unprivileged_user(self):
        sandbox_module._levels.clear()
        missing = Sandbox(repo_root=REPO, data_dir="/x", user="no_such_user_ias").level().missing
        sandbox_module._levels.clear()
        as_root = Sandbox(repo_root=REPO, data_dir="/x", user="root").level().missing
        if os.getuid() == 0:
            self.assertIn("no user 'no_such_user_ias'", missing)
            self.assertEqual(as_root, "[sandbox] user 'root' is root")
        else:       # the sandbox user only matters when iAs is root
            self.assertEqual((missing, as_root), ("", ""))

    def test_user_skills_and_servers_are_not_loaded_below_full(self):
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-level-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        config = Config(data_dir=tmp, skills_dir=PROBES)
        sandbox_module._levels[f"nobody:{os.getuid()}"] = sandbox_module.Level("none", "bubblewrap (bwrap) is not installed")
        from ias.registry import registry
        reg = registry(config)
        self.assertIsNone(reg.get("probe_escape"))
        self.assertIsNotNone(reg.get("get_current_datetime"), "system skills still load")
        self.assertIn(f"{PROBES / 'probe_escape' / 'SKILL.md'}:1: not loaded: the sandbox level here is none "
                      "(bubblewrap (bwrap) is not installed); user skills and MCP servers need the full level "
                      "(or [sandbox] allow_partial = true in ias.toml)", reg.problems)
        allowed = registry(replace(config, sandbox_allow_partial=True))
        self.assertIsNotNone(allowed.get("probe_escape"))

    def test_a_path_inside_the_data_directory_is_a_load_problem(self):
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-data-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        shutil.copytree(PROBES / "probe_network", tmp / "skills" / "probe_network")
        with (tmp / "skills" / "probe_network" / "SKILL.md").open("a") as f:
            f.write(f"- write: {tmp / 'var' / 'exports'}\n")
        from ias.registry import registry
        reg = registry(Config(data_dir=tmp / "var", skills_dir=tmp / "skills"))
        self.assertIsNone(reg.get("probe_network"))
        self.assertIn(f"{tmp / 'skills' / 'probe_network' / 'SKILL.md'}:1: not loaded: sandbox path "
                      f"{tmp / 'var' / 'exports'} overlaps the data directory", reg.problems)

    def test_the_sandbox_table_of_ias_toml(self):
        from ias.config import load
        from ias.errors import ConfigError
        tmp = Path(tempfile.mkdtemp(prefix="ias-sandbox-toml-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        (tmp / "ias.toml").write_text('[sandbox]\nuser = "ias-skills"\nallow_partial = true\n')
        config = load(tmp / "ias.toml", environ={})
        self.assertEqual((config.sandbox_user, config.sandbox_allow_partial), ("ias-skills", True))
        self.assertEqual((load(None, environ={}).sandbox_user, load(None, environ={}).sandbox_allow_partial),
                         (None, False))
        for text, message in (('[sandbox]\nallow_partial = "yes"\n', "allow_partial must be true or false"),
                              ('[sandbox]\nnetwork = true\n', "[sandbox] accepts only user")):
            (tmp / "bad.toml").write_text(text)
            with self.subTest(text=text), self.assertRaises(ConfigError) as caught:
                load(tmp / "bad.toml", environ={})
            self.assertIn(message, str(caught.exception))


if __name__ == "__main__":
    unittest.main()

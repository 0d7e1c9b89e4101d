"""The daemon's own process and its service: non-dumpable from the first line of every command, and a systemd
unit that keeps its hardening while allowing what the skill sandbox (bubblewrap) needs."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from tests.support import REPO

UNIT = REPO / "deploy" / "ias.service"
NOBODY = {"user": 65534, "group": 65534, "extra_groups": []}
# The namespaces bwrap makes for a skill (--unshare-all, user namespace when not root).
SANDBOX_NAMESPACES = {"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"}

# The CLI's start, then the flag as prctl reports it (PR_GET_DUMPABLE).
DUMPABLE_AFTER_MAIN = """
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from ias import cli
code = cli.main(["--config", "/nonexistent/ias.toml", "skills"])
print(code, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))
"""


def interpreter(as_nobody: bool) -> str:
    """A Python that runs iAs: as `nobody`, the system's (a venv's may sit under /root, closed to it)."""
    if not as_nobody:
        return sys.executable
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert found, "the test needs a python3 on /usr/bin for the user nobody"
    return found


class NonDumpableTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-dump-"))
        os.chmod(self.tmp, 0o755)
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_the_cli_makes_its_process_non_dumpable_before_anything_else(self):
        done = subprocess.run([sys.executable, "-c", DUMPABLE_AFTER_MAIN, str(REPO)], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.stdout.split(), ["1", "0"], done.stderr)       # even a command that fails at once

    def test_a_process_of_the_same_user_cannot_read_a_running_ias_environment(self):
        """The attacker's side: a skill runs as the same OS user as the daemon (not root: root reads anything)
        and reads /proc/PID/environ, where OPENAI_API_KEY and friends are."""
        as_root = os.geteuid() == 0
        who = NOBODY if as_root else {}
        config = self.tmp / "ias.toml"
        os.mkfifo(config, 0o644)                         # `ias` waits on it, running, after its start-up
        env = {"PATH": "/usr/bin:/bin", "IAS_DATA_DIR": str(self.tmp / "var"), "OPENAI_API_KEY": "sk-not-for-skills"}
        ias = subprocess.Popen([interpreter(as_root), str(REPO / "ias.py"), "--config", str(config), "skills"],
                               cwd=self.tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **who)
        control = subprocess.Popen(["sleep", "60"], env=env, **who)    # an ordinary process of that user
        writer = None
        try:
            deadline = time.monotonic() + 30
            while writer is None:                         # the config is opened once the reader waits on it
                try:
                    writer = os.open(config, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    if ias.poll() is not None:
                        self.fail(f"ias exited: {ias.stderr.read()!r}")
                    self.assertLess(time.monotonic(), deadline, "ias never opened its config")
                    time.sleep(0.01)
            self.assertIn(b"sk-not-for-skills", self.read_environ(control.pid, who).stdout)
            stolen = self.read_environ(ias.pid, who)
            self.assertNotEqual(stolen.returncode, 0)
            self.assertIn(b"Permission denied", stolen.stderr)
            self.assertNotIn(b"sk-not-for-skills", stolen.stdout)
        finally:
            if writer is not None:
                os.close(writer)
            for proc in (ias, control):
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
            ias.stderr.close()

    @staticmethod
    def read_environ(pid: int, who: dict) -> subprocess.CompletedProcess:
        return subprocess.run(["cat", f"/proc/{pid}/environ"], capture_output=True, timeout=30, **who)


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit's sections and their settings (a key may be given more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"not a unit line: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


class UnitTestCase(unittest.TestCase):
    def setUp(self):
        self.service = unit_settings(UNIT.read_text())["Service"]

    def last(self, key: str) -> str | None:
        values = self.service.get(key)
        return values[-1] if values else None

    def test_the_hardening_stays(self):
        for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                           "PrivateTmp": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
                           "ProtectClock": "yes", "RestrictSUIDSGID": "yes", "RestrictRealtime": "yes",
                           "LockPersonality": "yes", "SystemCallArchitectures": "native", "UMask": "0077",
                           "ProtectProc": "invisible", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
                           "StateDirectoryMode": "0700"}.items():
            self.assertEqual(self.last(key), value, key)
        self.assertNotIn(self.last("User"), (None, "root", "0"))

    def test_what_the_sandbox_needs_is_allowed(self):
        """bwrap makes a user namespace and the others, and mounts a fresh /proc for the skill's pid namespace:
        the kernel refuses that mount where parts of /proc are covered (ProtectKernelTunables, ProtectKernelLogs,
        ProcSubset=pid all cover some), and PrivateUsers would leave no room for another user namespace."""
        allowed = self.last("RestrictNamespaces")
        if allowed is not None:
            self.assertFalse(allowed.startswith("~") or allowed in ("yes", "true", "1"), allowed)
            self.assertLessEqual(SANDBOX_NAMESPACES, set(allowed.split()))
        for key in ("PrivateUsers", "ProtectKernelTunables", "ProtectKernelLogs"):
            self.assertIn(self.last(key), (None, "no", "false", "0"), key)
        self.assertIn(self.last("ProcSubset"), (None, "all"))

    def test_systemd_analyze_verifies_the_unit(self):
        """The shipped unit with its paths pointed at this checkout (verify insists that ExecStart exists)."""
        analyze = shutil.which("systemd-analyze")
        self.assertIsNotNone(analyze, "install systemd (systemd-analyze) to verify deploy/ias.service")
        with tempfile.TemporaryDirectory(prefix="ias-unit-") as tmp:
            unit = Path(tmp) / "ias.service"
            unit.write_text(UNIT.read_text().replace("/opt/ias/.venv/bin/python", sys.executable)
                            .replace("/opt/ias", str(REPO)))
            done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("ias.service", done.stderr)     # no warning about the unit itself


if __name__ == "__main__":
    unittest.main()

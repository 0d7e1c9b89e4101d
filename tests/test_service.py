"""`ias service install`: the unit it writes verifies with systemd-analyze (paths pointed at this checkout), and
installing runs the steps in order through an injected runner, so the test never changes the machine."""
import grp
import io
import pwd
import shutil
import subprocess
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

from ias import cli
from ias.service import TEMPLATE, ServiceError, install, render, service
from tests.support import REPO, keep_root_logging

ANALYZE_TIMEOUT = 120


def analyze(unit: Path) -> subprocess.CompletedProcess:
    found = shutil.which("systemd-analyze")
    assert found, "install systemd (systemd-analyze) to verify the unit"
    return subprocess.run([found, "verify", str(unit)], capture_output=True, text=True, timeout=ANALYZE_TIMEOUT)


def settings(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            found.setdefault(key, []).append(value)
    return found


class UnitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-service-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_the_printed_unit_verifies_and_names_this_checkout(self):
        out = io.StringIO()
        keep_root_logging(self)
        with redirect_stdout(out):
            code = cli.main(["service", "install", "--print", "--user", "ias", "--data-dir", "/var/lib/ias"])
        self.assertEqual(code, 0)
        unit = self.tmp / "ias.service"
        unit.write_text(out.getvalue())
        done = analyze(unit)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("ias.service", done.stderr)        # no warning about the unit itself
        found = settings(out.getvalue())
        self.assertEqual(found["ExecStart"], [f"{REPO}/.venv/bin/python {REPO}/ias.py"])
        self.assertEqual(found["WorkingDirectory"], [str(REPO)])
        self.assertEqual(found["Environment"], ["IAS_DATA_DIR=/var/lib/ias"])
        self.assertEqual(found["EnvironmentFile"], ["-/var/lib/ias/ias.env"])
        self.assertEqual((found["User"], found["StateDirectory"]), (["ias"], ["ias"]))
        self.assertNotIn("/opt/ias", out.getvalue())
        # Everything else is the template's: the hardening is kept as shipped.
        template = settings(TEMPLATE.read_text())
        for key in ("ProtectSystem", "RestrictNamespaces", "NoNewPrivileges", "KillMode", "Type", "WatchdogSec"):
            self.assertEqual(found[key], template[key], key)

    def test_a_data_directory_outside_var_lib_is_opened_by_path(self):
        unit = render(TEMPLATE.read_text(), service("svc", "/srv/ias-data", REPO))
        found = settings(unit)
        self.assertEqual(found["ReadWritePaths"], ["/srv/ias-data"])
        self.assertNotIn("StateDirectory", found)
        self.assertNotIn("StateDirectoryMode", found)

    def test_paths_the_service_cannot_use_are_refused_in_one_line(self):
        for user, data_dir, repo, fragment in (
                ("ias", "/var/lib/ias", Path("/home/me/ias"), "ProtectHome"),
                ("ias", "/root/data", REPO, "ProtectHome"),
                ("ias", "/var/lib/my ias", REPO, "a space"),
                ("-x", "/var/lib/ias", REPO, "not a user name")):
            with self.subTest(data_dir=data_dir, repo=repo), self.assertRaises(ServiceError) as caught:
                service(user, data_dir, repo)
            self.assertIn(fragment, str(caught.exception))
            self.assertNotIn("\n", str(caught.exception))


class InstallTest(unittest.TestCase):
    """install() with the machine replaced: the runner records, the user appears once useradd ran."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-install-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.ran: list[list[str]] = []
        self.lines: list[str] = []
        self.nobody = pwd.getpwnam("nobody")

    def lookup(self, name: str):
        if not any(argv[0] == "useradd" for argv in self.ran):
            raise KeyError(name)
        return self.nobody

    def test_install_creates_the_user_and_directory_writes_the_unit_and_starts_it(self):
        svc = service("iasuser", self.tmp / "state", REPO, lookup=self.lookup)
        unit = self.tmp / "ias.service"
        install(svc, unit_path=unit, run=self.ran.append, lookup=self.lookup,
                has=lambda name: "/usr/bin/apt-get" if name == "apt-get" else None,
                has_server=lambda: False, out=self.lines.append)
        self.assertEqual([argv[:2] for argv in self.ran],
                         [["useradd", "--system"], ["apt-get", "install"], [str(svc.python), "-m"],
                          ["systemctl", "daemon-reload"], ["systemctl", "enable"]])
        self.assertEqual(self.ran[0][-1], "iasuser")
        self.assertIn("bubblewrap", self.ran[1])
        self.assertEqual(self.ran[2][-1], f"{REPO}[qr,embedded]")      # no system PostgreSQL: the wheel too
        self.assertEqual(self.ran[4], ["systemctl", "enable", "--now", "ias.service"])
        state = (self.tmp / "state").stat()
        self.assertEqual((state.st_mode & 0o777, state.st_uid), (0o700, self.nobody.pw_uid))
        found = settings(unit.read_text())
        self.assertEqual(found["Environment"], [f"IAS_DATA_DIR={self.tmp / 'state'}"])
        self.assertEqual(found["EnvironmentFile"], [f"-{self.tmp / 'state' / 'ias.env'}"])
        self.assertEqual(found["User"], ["iasuser"])
        self.assertEqual(found["Group"], [grp.getgrgid(self.nobody.pw_gid).gr_name])   # what useradd made
        self.assertEqual(unit.stat().st_mode & 0o777, 0o644)
        done = analyze(unit)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("ias.service", done.stderr)
        said = "\n".join(self.lines)
        for step in ("sudo -u iasuser", "wechat login", "systemctl restart ias", "user skills:", "ProtectSystem"):
            self.assertIn(step, said)

    def test_an_existing_user_with_bwrap_and_postgres_only_gets_the_qr_extra(self):
        svc = service("nobody", self.tmp / "state", REPO)
        install(svc, unit_path=self.tmp / "ias.service", run=self.ran.append, lookup=pwd.getpwnam,
                has=lambda name: f"/usr/bin/{name}", has_server=lambda: True, out=self.lines.append)
        self.assertEqual([argv[0] for argv in self.ran], [str(svc.python), "systemctl", "systemctl"])
        self.assertEqual(self.ran[0][-1], f"{REPO}[qr]")
        found = settings((self.tmp / "ias.service").read_text())
        self.assertEqual((found["User"], found["Group"]), (["nobody"], [grp.getgrgid(self.nobody.pw_gid).gr_name]))

    def test_apt_get_update_when_bubblewrap_is_not_found_at_first(self):
        def run(argv):
            self.ran.append(argv)
            if argv[:2] == ["apt-get", "install"] and ["apt-get", "update", "-qq"] not in self.ran:
                raise ServiceError("`apt-get install` failed: Unable to locate package bubblewrap")
        install(service("nobody", self.tmp / "state", REPO), unit_path=self.tmp / "ias.service", run=run,
                lookup=pwd.getpwnam, has=lambda name: "/usr/bin/apt-get" if name == "apt-get" else None,
                has_server=lambda: True, out=self.lines.append)
        self.assertEqual([argv[:2] for argv in self.ran[:3]],
                         [["apt-get", "install"], ["apt-get", "update"], ["apt-get", "install"]])
        self.assertIn("installed bubblewrap (the skill sandbox)", self.lines)

    def test_a_checkout_without_a_venv_is_refused_before_anything_changes(self):
        repo = self.tmp / "checkout"
        repo.mkdir()
        with self.assertRaises(ServiceError) as caught:
            install(service("ias", self.tmp / "state", repo), unit_path=self.tmp / "ias.service", run=self.ran.append,
                    lookup=self.lookup, out=self.lines.append)
        self.assertIn("run `make`", str(caught.exception))
        self.assertEqual(self.ran, [])
        self.assertFalse((self.tmp / "state").exists())

    def test_a_failing_step_is_one_line_naming_it(self):
        from ias.service import run_step
        with self.assertRaises(ServiceError) as caught:
            run_step(["sh", "-c", "echo first >&2; echo 'no such package' >&2; exit 3"])
        self.assertIn("failed: first / no such package", str(caught.exception))


if __name__ == "__main__":
    unittest.main()

"""Which data directory a command uses: the installed service's when run from its checkout with the default,
and one line naming the directory when this user cannot use it; root becomes the directory's owner."""
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path
from unittest import mock

from ias import cli, config as config_module
from ias.datadir import check, locate, named, service_data_dir
from ias.errors import ConfigError
from ias.service import TEMPLATE, render, service
from tests.support import REPO, keep_root_logging, slow

NOBODY = pwd.getpwnam("nobody")
STEP = 60


class LocateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-datadir-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.unit = self.tmp / "ias.service"
        self.unit.write_text(render(TEMPLATE.read_text(), service("ias", "/var/lib/ias-test", REPO)))
        cwd = os.getcwd()
        os.chdir(self.tmp)                              # the default ./var is the temporary directory's
        self.addCleanup(os.chdir, cwd)

    def test_the_unit_naming_this_checkout_gives_its_data_directory(self):
        self.assertEqual(service_data_dir(self.unit, REPO), Path("/var/lib/ias-test"))
        self.assertIsNone(service_data_dir(self.unit, self.tmp))            # another checkout's service
        self.assertIsNone(service_data_dir(self.tmp / "none.service", REPO))

    def test_a_default_data_directory_becomes_the_service_s(self):
        env = {"PATH": os.environ["PATH"]}
        config = locate(config_module.load(None, env), None, env, self.unit)
        self.assertEqual(config.data_dir, Path("/var/lib/ias-test"))
        self.assertEqual(config.cluster_dir, Path("/var/lib/ias-test/pg"))

    def test_a_data_directory_chosen_by_the_user_is_kept(self):
        env = {"PATH": os.environ["PATH"], "IAS_DATA_DIR": str(self.tmp / "mine")}
        self.assertEqual(locate(config_module.load(None, env), None, env, self.unit).data_dir, self.tmp / "mine")
        (self.tmp / "ias.toml").write_text('data_dir = "/srv/elsewhere"\n')
        env = {"PATH": os.environ["PATH"]}
        self.assertEqual(locate(config_module.load(None, env), None, env, self.unit).data_dir, Path("/srv/elsewhere"))


    def test_the_directory_named_before_the_config_is_read(self):
        self.assertEqual(named(None, {"IAS_DATA_DIR": "/srv/x"}, self.unit), Path("/srv/x"))
        self.assertEqual(named(None, {}, self.unit), Path("/var/lib/ias-test"))
        self.assertIsNone(named("my.toml", {}, self.unit))                  # ias.toml may name another one
        self.assertIsNone(named(None, {"IAS_CONFIG": "my.toml"}, self.unit))
        (self.tmp / "ias.toml").write_text("")
        self.assertIsNone(named(None, {}, self.unit))

    def test_a_command_run_in_the_checkout_uses_the_service_s_data_directory(self):
        """Through the command line, as an admin runs `ias skills` in /opt/ias: the listing's cache is written in
        the service's data directory, and no ./var is made."""
        data_dir = self.tmp / "service-data"
        data_dir.mkdir()
        self.unit.write_text(render(TEMPLATE.read_text(), service("ias", data_dir, REPO)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("IAS_")}
        keep_root_logging(self)
        with mock.patch("ias.datadir.UNIT_PATH", self.unit), mock.patch.dict(os.environ, env, clear=True), \
                redirect_stdout(io.StringIO()) as out:
            self.assertEqual(cli.main(["skills", "--json"]), 0)
        self.assertTrue(json.loads(out.getvalue()))
        self.assertTrue((data_dir / "skills.cache.json").exists(), list(data_dir.iterdir()))
        self.assertFalse((self.tmp / "var").exists())


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-datadir-"))
        os.chmod(self.tmp, 0o755)
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_root_on_a_directory_another_user_owns_becomes_that_user(self):
        directory = self.tmp / "data"
        directory.mkdir()
        os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
        became = []
        check(directory, euid=0, become=lambda entry, directory: became.append(entry.pw_name))
        self.assertEqual(became, ["nobody"])
        check(self.tmp, euid=0, become=lambda entry, directory: became.append(entry.pw_name))
        self.assertEqual(became, ["nobody"])                # root's own directory: nothing to become

    def as_nobody(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        """`ias ARGS…` as nobody with the system's python3 (the venv may sit where nobody cannot read)."""
        python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        script = f"import sys; sys.path.insert(0, {str(REPO)!r}); from ias import cli; sys.exit(cli.main(sys.argv[1:]))"
        return subprocess.run(["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                               python, "-c", script, *args], cwd=self.tmp, capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], **env}, timeout=STEP)

    def test_a_missing_or_closed_directory_is_one_line_naming_it(self):
        missing = self.tmp / "missing" / "var"
        closed = self.tmp / "closed"
        closed.mkdir(mode=0o700)
        for directory, fragment in ((missing, f"does not exist and nobody cannot create it in {self.tmp}"),
                                    (closed, "belongs to root, not writable by nobody")):
            with self.subTest(directory=directory):
                done = self.as_nobody("skills", env={"IAS_DATA_DIR": str(directory)})
                self.assertEqual(done.returncode, 1, done.stderr)
                self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
                self.assertIn(str(directory), done.stderr)
                self.assertIn(fragment, done.stderr)
                self.assertNotIn("Permission denied", done.stderr)

    def test_an_unnamed_owner_is_one_line(self):
        directory = self.tmp / "data"
        directory.mkdir()
        os.chown(directory, 54321, 54321)
        with self.assertRaises(ConfigError) as caught:
            check(directory, euid=0, become=lambda entry, directory: None)
        self.assertIn("uid 54321", str(caught.exception))

    @slow
    def test_a_command_run_as_root_runs_as_the_owner_of_the_data_directory(self):
        """Before its env file is read: one that belongs to the service's user is refused to anyone else."""
        directory = self.tmp / "data"
        directory.mkdir(mode=0o700)
        env_file = directory / "ias.env"
        env_file.write_text("IAS_MODEL=from-the-env-file\n")
        os.chmod(env_file, 0o600)
        for path in (directory, env_file):
            os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IAS_", "PG"))}
        done = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills", "--json"], cwd=self.tmp,
                              env={**env, "IAS_DATA_DIR": str(directory)}, capture_output=True, text=True,
                              timeout=STEP)
        self.assertEqual(done.returncode, 0, done.stderr)
        written = list(directory.iterdir())
        self.assertTrue(written, "the command wrote nothing in the data directory")
        self.assertEqual({path.stat().st_uid for path in written}, {NOBODY.pw_uid}, written)
        self.assertGreater(len(written), 1, "only the env file is there")


if __name__ == "__main__":
    unittest.main()

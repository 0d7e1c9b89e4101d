"""`ias backup` and `ias restore` as a user runs them (issue 24's "Must show"): a backup made while the daemon
runs, restored into a fresh data directory holding the same key, brings back the tasks, the conversation
history and the audit log, which verifies there; a non-empty database is refused; another key is named."""
import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

from ias.pgcluster import Cluster, find_bindir
from tests.e2e_support import ECHO, STEP, Copy, EchoLLM, llm_env
from tests.support import slow


@slow
class BackupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.copy = Copy()
        cls.addClassCleanup(cls.copy.remove)

    def setUp(self):
        self.copy.reset()
        self.addCleanup(self.copy.reset)
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-restore-"))
        os.chmod(self.tmp, 0o755)                       # as root, the embedded server runs as `postgres`
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def data_dir(self, name: str, key: bool) -> Path:
        """A fresh data directory, holding the copy's secret key or none; its cluster stopped after the test."""
        directory = self.tmp / name
        directory.mkdir()
        os.chmod(directory, 0o755)                      # as ./var is: the `postgres` user reaches pg/ in it
        if key:
            shutil.copy2(self.copy.root / "var" / "secret.key", directory / "secret.key")
        self.addCleanup(self.stop_cluster, directory / "pg")
        return directory

    @staticmethod
    def stop_cluster(pgdata: Path) -> None:
        if Cluster(pgdata).running():
            subprocess.run([str(find_bindir() / "pg_ctl"), "stop", "-D", str(pgdata), "-m", "immediate", "-w"],
                           cwd="/", user=pgdata.stat().st_uid, capture_output=True, timeout=STEP)

    def ias(self, *args: str, env: dict[str, str] | None = None, code: int = 0):
        result = self.copy.ias(*args, env=env)
        self.assertEqual(result.returncode, code, result.describe())
        self.assertNotIn("Traceback", result.stderr)
        return result

    def test_a_backup_made_while_the_daemon_runs_restores_tasks_history_and_audit(self):
        backup = self.tmp / "ias.dump"
        with EchoLLM() as llm:
            daemon = self.copy.daemon(llm_env(llm))
            self.assertEqual(daemon.reply("请记住：钥匙在花盆下"), ECHO + "请记住：钥匙在花盆下", daemon.stderr()[-3000:])
            self.ias("tasks", "add", "--name", "浇花", "--schedule", "0 7 * * *", "--text", "给花浇水")
            self.ias("run", "get_current_datetime", "{}")
            made = self.ias("backup", str(backup))
            self.assertIn(str(backup), made.stdout)
            self.assertIn("not the secret key", made.stdout)
            self.assertEqual(backup.stat().st_mode & 0o777, 0o600)
            refused = self.ias("restore", str(backup), code=1)      # the daemon's own database is not empty
            self.assertIn("not empty", refused.stderr)
            self.assertEqual(len(refused.stderr.strip().splitlines()), 1, refused.stderr)
            self.assertEqual(daemon.reply("还在吗"), ECHO + "还在吗", "the daemon after the backup")
            self.assertEqual(daemon.terminate(), 0, daemon.stderr()[-3000:])

            fresh = self.data_dir("fresh", key=True)
            env = {"IAS_DATA_DIR": str(fresh)}
            restored = self.ias("restore", str(backup), env=env)
            self.assertIn(f"no database in {fresh}", restored.stderr)      # a new cluster is named, never silent
            self.assertIn("chain intact", restored.stdout)
            self.assertTrue((fresh / "audit.head").exists(), "the chain head was not re-anchored")
            self.assertIn("chain intact", self.ias("audit", "--verify", env=env).stdout)
            self.assertIn("浇花: 给花浇水", self.ias("tasks", "list", env=env).stdout)
            self.assertTrue(any("get_current_datetime" in line
                                for line in self.ias("audit", "--limit", "100", env=env).stdout.splitlines()))
            # The history: the restored daemon's next turn carries the owner's earlier message to the model.
            daemon = self.copy.daemon({**llm_env(llm), **env})
            self.assertEqual(daemon.reply("钥匙在哪"), ECHO + "钥匙在哪", daemon.stderr()[-3000:])
            sent = [m.get("content") for m in llm.requests[-1]["messages"]]
            self.assertIn("请记住：钥匙在花盆下", sent)
            self.assertEqual(daemon.terminate(), 0, daemon.stderr()[-3000:])
            self.assertIn("not empty", self.ias("restore", str(backup), env=env, code=1).stderr)

        keyless = self.data_dir("keyless", key=False)
        other = self.ias("restore", str(backup), env={"IAS_DATA_DIR": str(keyless)}, code=1)
        self.assertIn("restored", other.stdout)
        self.assertIn(f"cannot be verified with {keyless / 'secret.key'}", other.stderr)
        self.assertIn("secret.key", other.stderr.splitlines()[-1])

    def test_default_name_in_the_working_directory_and_one_line_errors(self):
        self.ias("tasks", "list")                                   # the copy's database exists
        made = self.ias("backup")
        files = sorted(self.copy.root.glob("ias-backup-*.dump"))
        self.assertEqual(len(files), 1, made.stdout)
        self.addCleanup(files[0].unlink)
        self.assertRegex(files[0].name, r"^ias-backup-\d{8}-\d{6}\.dump$")
        again = self.ias("backup", str(files[0]), code=1)
        self.assertIn("exists", again.stderr)
        (self.tmp / "not.dump").write_text("hello")
        bad = self.ias("restore", str(self.tmp / "not.dump"), code=1)
        self.assertIn("not an `ias backup` file", bad.stderr)
        empty = self.data_dir("empty", key=True)
        nothing = self.ias("backup", str(self.tmp / "x.dump"), env={"IAS_DATA_DIR": str(empty)}, code=1)
        self.assertIn("nothing to back up", nothing.stderr)
        self.assertFalse((empty / "pg").exists(), "a backup made a cluster")
        for result in (again, bad, nothing):
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)


if __name__ == "__main__":
    unittest.main()

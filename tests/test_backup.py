"""`ias backup` and `ias restore` as a user runs them (issue 24's "Must show"): a backup made while the daemon
runs, restored into a fresh data directory holding the same key, brings back the tasks, the conversation
history, the memories and the audit log, which verifies there; a non-empty database is refused; another key is named."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from ias.pgcluster import Cluster, find_bindir
from tests.e2e_support import ECHO, STEP, EchoLLM, llm_env
from tests.test_e2e import E2ETestCase
from tests.support import REPO, server_dsn, slow


class BackupTest(E2ETestCase):
    """A fresh copy of the repository run as the README says (tests/e2e_support.py)."""

    def setUp(self):
        super().setUp()
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
            self.ias("run", "remember", '{"text": "备用钥匙在门口地垫下"}')       # a long-term memory (issue 27)
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
            self.assertIn("备用钥匙在门口地垫下", sent[0], "the memory is restored and in the system prompt")
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


@slow
class DatabaseUrlTest(unittest.TestCase):
    """With IAS_DATABASE_URL: the system's pg_dump and pg_restore, a new database as the empty one."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-backup-url-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def database(self) -> str:
        name = "ias_backup_" + uuid.uuid4().hex[:10]
        with psycopg.connect(server_dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.addCleanup(self.drop, name)
        return make_conninfo(server_dsn(), dbname=name)

    @staticmethod
    def drop(name: str) -> None:
        with psycopg.connect(server_dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def ias(self, dsn: str, data_dir: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IAS_", "PG"))}
        done = subprocess.run([sys.executable, str(REPO / "ias.py"), *args], capture_output=True, text=True,
                              cwd=self.tmp, timeout=STEP, env={**env, "IAS_DATABASE_URL": dsn,
                                                               "IAS_DATA_DIR": str(data_dir)})
        self.assertEqual(done.returncode, code, done.stdout + done.stderr)
        return done

    def test_backup_and_restore_into_a_new_database(self):
        source, target = self.database(), self.database()
        first, second = self.tmp / "first", self.tmp / "second"
        self.ias(source, first, "tasks", "add", "--name", "周报", "--schedule", "every 7d", "--text", "写周报")
        self.ias(source, first, "run", "get_current_datetime", "{}")
        self.ias(source, first, "backup", str(self.tmp / "url.dump"))
        second.mkdir()
        shutil.copy2(first / "secret.key", second / "secret.key")
        restored = self.ias(target, second, "restore", str(self.tmp / "url.dump"))
        self.assertIn("chain intact", restored.stdout)
        self.assertIn("周报: 写周报", self.ias(target, second, "tasks", "list").stdout)
        self.assertIn("chain intact", self.ias(target, second, "audit", "--verify").stdout)
        refused = self.ias(source, first, "restore", str(self.tmp / "url.dump"), code=1)
        self.assertIn("the database at IAS_DATABASE_URL is not empty", refused.stderr)


if __name__ == "__main__":
    unittest.main()

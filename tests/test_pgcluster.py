"""The embedded cluster shared by real processes: concurrent starts, the last user stops it, kill -9,
a killed postmaster, the daemon's file lock, and where the server binaries are found."""
import asyncio
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from ias.daemon import instance_lock
from ias.config import Config
from ias.errors import ClusterError, IasError
from ias.locks import FileLock
from ias.pgcluster import Cluster, find_bindir, wheel_bindir
from tests.support import REPO, slow

# One iAs-like user of the cluster: start (or join) it, query, say "up", wait for a line, stop using it.
USER = """
import sys
sys.path.insert(0, sys.argv[2])
import psycopg
from ias.pgcluster import Cluster
cluster = Cluster(sys.argv[1], fsync=False)
with psycopg.connect(cluster.start(), autocommit=True) as conn:
    conn.execute("SELECT 1")
print("up", flush=True)
sys.stdin.readline()
cluster.stop()
"""

# Holds one lock until killed.
HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from ias.locks import FileLock
assert FileLock(sys.argv[1]).acquire(wait=False)
print("held", flush=True)
time.sleep(60)
"""


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat.rsplit(")", 1)[1].split()[0] in "ZX":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive")


def wait_until(predicate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


class CountingCluster(Cluster):
    """A cluster that counts the `pg_ctl start`s it runs."""
    starts = 0

    def _run(self, *args, **options):
        if args[:2] == ("pg_ctl", "start"):
            self.starts += 1
        return super()._run(*args, **options)


@slow
class ClusterCase(unittest.TestCase):
    """A fresh data directory per test, and iAs-like processes that use it."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-pgc-"))
        os.chmod(self.tmp, 0o755)                 # as root, the server runs as `postgres`
        self.datadir = self.tmp / "pg"
        self.procs: list[subprocess.Popen] = []

    def tearDown(self):
        for proc in self.procs:
            proc.kill()                               # a no-op for one that exited
            with proc:                                # closes its pipes and reaps it
                pass
        cluster = Cluster(self.datadir)
        if cluster.running():
            # pg_ctl as the data directory's owner (never root), as the cluster itself runs it
            subprocess.run([str(find_bindir() / "pg_ctl"), "stop", "-D", str(self.datadir), "-m", "immediate", "-w"],
                           cwd="/", user=self.datadir.stat().st_uid, capture_output=True, timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def spawn(self, script: str, arg: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", script, str(arg), str(REPO)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def user(self) -> subprocess.Popen:
        return self.spawn(USER, self.datadir)

    def up(self, proc: subprocess.Popen) -> None:
        self.assertEqual(proc.stdout.readline(), "up\n")

    def leave(self, proc: subprocess.Popen) -> None:
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.assertEqual(proc.wait(timeout=30), 0)

    def answers(self) -> bool:
        with psycopg.connect(Cluster(self.datadir).dsn, autocommit=True) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def postmaster(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])


class ClusterTestCase(ClusterCase):
    def test_concurrent_starts_share_one_server_that_the_last_user_stops(self):
        users = [self.user() for _ in range(5)]          # a fresh data directory: initdb races too
        for proc in users:
            self.up(proc)
        observer = Cluster(self.datadir)
        self.assertTrue(observer.running())
        postmaster = self.postmaster()
        for proc in users[:-1]:
            self.leave(proc)
            self.assertTrue(observer.running())
            self.assertTrue(self.answers())
            self.assertEqual(self.postmaster(), postmaster)
        self.leave(users[-1])
        self.assertFalse(observer.running())
        self.assertFalse((self.datadir / "postmaster.pid").exists())
        wait_gone(postmaster)

    def test_a_user_that_joins_later_keeps_the_server_for_itself(self):
        first = self.user()
        self.up(first)
        second = self.user()
        self.up(second)
        self.leave(first)                                # the one that started it
        self.assertTrue(self.answers())
        self.leave(second)
        self.assertFalse(Cluster(self.datadir).running())

    def test_kill_9_of_a_user_releases_its_share(self):
        first, second = self.user(), self.user()
        self.up(first)
        self.up(second)
        second.kill()
        second.wait()
        self.leave(first)                                # now the last user: it stops the server
        self.assertFalse(Cluster(self.datadir).running())

    def test_lock_descriptors_are_not_inherited_by_postgres(self):
        cluster = Cluster(self.datadir, fsync=False)
        cluster.start()
        try:
            for pid in [self.postmaster()]:
                targets = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
                self.assertFalse({str(self.tmp / "pg.users"), str(self.tmp / "pg.lock")} & targets)
        finally:
            cluster.stop()

    def test_start_again_after_kill_9_of_the_postmaster(self):
        cluster = Cluster(self.datadir, fsync=False)
        dsn = cluster.start()
        self.assertEqual(cluster.start(), dsn)          # idempotent while it runs: same server
        busy = threading.Thread(target=self.busy_backend, args=(dsn,))
        busy.start()
        try:
            time.sleep(0.3)                              # the query is running
            postmaster = self.postmaster()
            os.kill(postmaster, signal.SIGKILL)
            wait_gone(postmaster)
            self.assertFalse(cluster.running())
            # Stale postmaster.pid, and the busy backend still holds the shared memory for a moment.
            with self.assertLogs("ias.pgcluster", "INFO") as logs:
                self.assertEqual(cluster.start(), dsn)
            self.assertIn("retrying", "\n".join(logs.output))
        finally:
            busy.join()
        self.assertNotEqual(self.postmaster(), postmaster)
        self.assertTrue(self.answers())
        cluster.stop()
        self.assertFalse(cluster.running())

    @staticmethod
    def busy_backend(dsn: str) -> None:
        """A backend that computes without looking at its postmaster for about a second."""
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT count(*) FROM generate_series(1, 20000000)")
        except psycopg.OperationalError:
            pass

    def test_a_restart_by_someone_else_is_waited_for_never_fought(self):
        cluster = CountingCluster(self.datadir, fsync=False)
        dsn = cluster.start()
        cluster.starts = 0
        before = self.postmaster()
        held = psycopg.connect(dsn, autocommit=True)    # a smart restart stays "stopping" while it is open
        restart = subprocess.Popen([str(find_bindir() / "pg_ctl"), "restart", "-D", str(self.datadir), "-m", "smart",
                                    "-w", "-l", str(self.datadir / "server.log")], cwd="/",
                                   user=self.datadir.stat().st_uid, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(restart)
        wait_until(lambda: (cluster._postmaster() or (0, ""))[1] == "stopping")
        returned = []
        starting = threading.Thread(target=lambda: returned.append((cluster.start(), time.monotonic())))
        starting.start()
        time.sleep(0.5)
        self.assertTrue(starting.is_alive())            # waiting for the server, not starting one
        held.close()
        self.assertEqual(restart.wait(timeout=60), 0, restart.stderr.read())      # the restart was not fought
        ready = time.monotonic()
        starting.join(timeout=30)
        self.assertEqual(returned[0][0], dsn)
        self.assertLess(returned[0][1], ready + 1.0)
        self.assertEqual(cluster.starts, 0)
        self.assertNotEqual(self.postmaster(), before)
        self.assertTrue(self.answers())
        cluster.stop()

    def test_a_stop_by_someone_else_is_followed_by_one_start(self):
        cluster = CountingCluster(self.datadir, fsync=False)
        cluster.start()
        cluster.starts = 0
        held = psycopg.connect(cluster.dsn, autocommit=True)
        stop = subprocess.Popen([str(find_bindir() / "pg_ctl"), "stop", "-D", str(self.datadir), "-m", "smart", "-w"],
                                cwd="/", user=self.datadir.stat().st_uid, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.procs.append(stop)
        wait_until(lambda: (cluster._postmaster() or (0, ""))[1] == "stopping")
        starting = threading.Thread(target=cluster.start)
        starting.start()
        time.sleep(0.3)
        held.close()
        self.assertEqual(stop.wait(timeout=60), 0)
        starting.join(timeout=30)
        self.assertEqual(cluster.starts, 1)             # after the stop, and only once
        self.assertTrue(self.answers())
        cluster.stop()

    def test_the_generated_settings_bound_the_wal(self):
        cluster = Cluster(self.datadir, fsync=False)
        cluster.start()
        try:
            settings = (self.datadir / "ias.conf").read_text()
            self.assertIn("max_wal_size = 256MB", settings)
            with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                wal = conn.execute("SELECT setting::bigint * pg_size_bytes('1' || unit) FROM pg_settings "
                                   "WHERE name IN ('max_wal_size', 'min_wal_size') ORDER BY name").fetchall()
            self.assertLessEqual(wal[0][0], 256 * 2 ** 20)
            self.assertLessEqual(wal[1][0], 32 * 2 ** 20)
        finally:
            cluster.stop()

    def test_a_big_server_log_is_rotated_at_the_next_start_by_its_owner(self):
        cluster = Cluster(self.datadir, fsync=False)
        cluster.log_max = 1000
        cluster.start()
        cluster.stop()
        log_file = self.datadir / "server.log"
        with open(log_file, "a", encoding="ascii") as out:
            out.write("x" * 2000 + "\n")
        cluster.start()
        try:
            old = self.datadir / "server.log.1"
            self.assertIn("x" * 2000, old.read_text())
            self.assertLess(log_file.stat().st_size, 1000)
            self.assertEqual(old.stat().st_uid, self.datadir.stat().st_uid)
        finally:
            cluster.stop()
        cluster.start()                             # small again: left as it is, the old one kept
        cluster.stop()
        self.assertIn("x" * 2000, (self.datadir / "server.log.1").read_text())

    def test_stop_without_start_leaves_the_server_alone(self):
        user = self.user()
        self.up(user)
        Cluster(self.datadir).stop()
        self.assertTrue(self.answers())
        self.leave(user)


NOBODY = {"user": 65534, "group": 65534, "extra_groups": []}


class PasswordTestCase(ClusterCase):
    """The cluster is closed to whoever reaches its socket without the password file, and iAs writes its data
    directory only as the directory's owner."""

    @property
    def nowhere(self) -> str:
        return str(self.tmp / "no-passfile")

    def started(self) -> Cluster:
        cluster = Cluster(self.datadir, fsync=False)
        cluster.start()
        self.addCleanup(cluster.stop)
        return cluster

    def refused(self, conninfo: str) -> str:
        with self.assertRaises(psycopg.OperationalError) as raised:
            psycopg.connect(conninfo, autocommit=True).close()
        return str(raised.exception)

    def trust_lines(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_hba_file_rules WHERE auth_method <> 'scram-sha-256' "
                                "AND 'replication' <> ALL(database)").fetchone()[0]

    def test_every_connection_needs_the_password_from_the_file_next_to_the_data_directory(self):
        with self.assertLogs("ias.pgcluster", "INFO") as logs:
            cluster = self.started()
        password = cluster.passfile.read_text().strip().rsplit(":", 1)[1]
        self.assertEqual(len(password), 64)
        st = cluster.passfile.stat()
        self.assertEqual((st.st_mode & 0o777, st.st_uid), (0o600, os.geteuid()))   # the daemon's, not postgres's
        self.assertIn("no password supplied", self.refused(make_conninfo(cluster.dsn, passfile=self.nowhere)))
        self.assertIn("password authentication failed",
                      self.refused(make_conninfo(cluster.dsn, passfile=self.nowhere, password="guess")))
        self.assertTrue(self.answers())
        self.assertEqual(self.trust_lines(cluster.dsn), 0)
        self.assertNotIn(password, "\n".join(logs.output))
        server_log = (self.datadir / "server.log").read_bytes().decode(errors="replace")
        self.assertNotIn(password, server_log)

    def test_another_user_that_reaches_the_socket_cannot_connect(self):
        """The attacker's side: a process of another OS user (a skill as `nobody`) sees the socket, as a careless
        mount or directory mode would show it, and knows where the password file is."""
        cluster = self.started()
        os.chmod(self.datadir, 0o711)                    # the socket reachable by every user
        as_root = os.geteuid() == 0
        attacker = NOBODY if as_root else {}             # not root: the same user, without the file
        conninfo = cluster.dsn if as_root else make_conninfo(cluster.dsn, passfile=self.nowhere)
        psql = subprocess.run([str(find_bindir() / "psql"), "-w", "-X", "-d", conninfo, "-c", "SELECT 1"],
                              cwd="/", env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, capture_output=True,
                              text=True, timeout=60, **attacker)
        self.assertNotEqual(psql.returncode, 0, psql.stdout)
        self.assertIn("no password supplied", psql.stderr)
        if as_root:
            read = subprocess.run(["cat", str(cluster.passfile)], capture_output=True, text=True, timeout=60,
                                  **attacker)
            self.assertIn("Permission denied", read.stderr)
        self.assertTrue(self.answers())                   # with the file: in

    def legacy_cluster(self, *, running: bool = False) -> None:
        """A data directory as iAs made it before passwords: initdb --auth=trust, ias.conf included; `running`:
        its server started, as an older daemon would have it."""
        self.datadir.mkdir(mode=0o700)
        owner = {}
        if os.geteuid() == 0:                            # as root, initdb runs as `postgres`
            entry = pwd.getpwnam("postgres")
            os.chown(self.datadir, entry.pw_uid, entry.pw_gid)
            owner = {"user": entry.pw_uid, "group": entry.pw_gid}
        subprocess.run([str(find_bindir() / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                        "--encoding=UTF8", "--locale=C", "--no-sync"], cwd="/", capture_output=True, check=True,
                       timeout=120, **owner)
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write("\ninclude_if_exists = 'ias.conf'\n")
        if running:
            options = f"-c unix_socket_directories={self.datadir} -c listen_addresses='' -c fsync=off"
            subprocess.run([str(find_bindir() / "pg_ctl"), "start", "-D", str(self.datadir), "-w", "-o", options,
                            "-l", str(self.datadir / "server.log")], cwd="/", capture_output=True, check=True,
                           timeout=120, **owner)

    def test_a_trust_server_still_running_is_joined_and_closed_when_it_next_starts(self):
        self.legacy_cluster(running=True)
        cluster = Cluster(self.datadir, fsync=False)
        with psycopg.connect(cluster.start(), autocommit=True) as conn:     # an older daemon's server: joined
            self.assertEqual(conn.execute("SELECT 1").fetchone(), (1,))
        self.assertFalse(cluster.passfile.exists())
        cluster.stop()                                   # the last user stops it
        self.assertFalse(cluster.running())
        self.started()
        self.assertIn("no password supplied", self.refused(make_conninfo(cluster.dsn, passfile=self.nowhere)))
        self.assertTrue(self.answers())

    def test_a_cluster_made_with_trust_is_closed_on_its_next_start(self):
        self.legacy_cluster()
        self.assertFalse(Cluster(self.datadir).passfile.exists())
        first = self.user()                              # another process upgrades it
        self.up(first)
        second = self.user()                             # and the next one joins with the same password
        self.up(second)
        cluster = Cluster(self.datadir)
        self.assertIn("no password supplied", self.refused(make_conninfo(cluster.dsn, passfile=self.nowhere)))
        self.assertTrue(self.answers())
        self.assertEqual(self.trust_lines(cluster.dsn), 0)
        self.leave(first)
        self.leave(second)
        self.assertFalse(cluster.running())
        with psycopg.connect(self.started().dsn, autocommit=True) as conn:     # a plain restart changes nothing
            self.assertEqual(conn.execute("SELECT 1").fetchone(), (1,))

    def test_a_link_planted_in_the_data_directory_is_replaced_never_followed(self):
        """As root, ias.conf was written and chowned through a link the `postgres` user planted there."""
        cluster = Cluster(self.datadir, fsync=False)
        cluster.start()
        cluster.stop()
        outside = self.tmp / "outside"
        outside.mkdir(mode=0o755)
        target = outside / "roots-file"
        target.write_text("root's own\n")
        target.chmod(0o644)
        link = self.datadir / "ias.conf"
        link.unlink()
        link.symlink_to(target)
        owner = self.datadir.stat()
        os.lchown(link, owner.st_uid, owner.st_gid)     # planted by the server's user
        before = target.stat()
        self.started()
        after = target.stat()
        self.assertEqual(target.read_text(), "root's own\n")
        self.assertEqual((after.st_uid, after.st_gid, after.st_mode), (before.st_uid, before.st_gid, before.st_mode))
        self.assertFalse(link.is_symlink())
        self.assertEqual(link.stat().st_uid, owner.st_uid)
        self.assertIn("unix_socket_directories", link.read_text())

    def test_the_server_runs_with_its_owner_s_groups(self):
        self.started()
        status = dict(line.split(":", 1) for line in Path(f"/proc/{self.postmaster()}/status").read_text().splitlines())
        owner = self.datadir.stat()
        self.assertEqual(int(status["Uid"].split()[0]), owner.st_uid)
        self.assertEqual(int(status["Gid"].split()[0]), owner.st_gid)
        if os.geteuid() == 0:
            self.assertNotIn("0", status["Groups"].split())         # never root's group (subprocess `user=` alone)


class InstanceLockTestCase(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-lock-"))
        self.config = Config(data_dir=self.tmp / "var")

    async def asyncTearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    async def test_a_second_daemon_is_refused_until_the_first_is_gone(self):
        async with instance_lock(self.config):
            for _ in range(2):
                with self.assertRaisesRegex(IasError, "another iAs daemon is already running"):
                    async with instance_lock(self.config):
                        pass
        async with instance_lock(self.config):          # released at exit
            pass

    async def test_kill_9_of_the_holder_releases_the_lock(self):
        path = self.config.data_dir / "daemon.lock"
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(REPO)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            self.assertEqual(await asyncio.to_thread(holder.stdout.readline), "held\n")
            with self.assertRaisesRegex(IasError, "another iAs daemon is already running"):
                async with instance_lock(self.config):
                    pass
        finally:
            holder.kill()
            holder.wait()
            holder.stdout.close()
        async with instance_lock(self.config):
            pass

    def test_a_lock_cannot_be_taken_twice_through_one_object(self):
        lock = FileLock(self.tmp / "x.lock")
        self.assertTrue(lock.acquire(shared=True))
        with self.assertRaises(RuntimeError):
            lock.acquire()
        lock.release()
        self.assertTrue(lock.acquire(wait=False))
        lock.release()


class BindirTestCase(unittest.TestCase):
    """find_bindir's order: PATH, the newest /usr/lib/postgresql/*/bin, the pgserver wheel."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-bin-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def server(self, relative: str, programs=("initdb", "pg_ctl", "postgres")) -> Path:
        directory = self.tmp / relative
        directory.mkdir(parents=True)
        for name in programs:
            (directory / name).write_text("#!/bin/sh\n")
            (directory / name).chmod(0o755)
        return directory

    def find(self, path: str = "", wheel: Path | None = None) -> Path:
        return find_bindir(path=path, system=str(self.tmp / "lib/postgresql/*/bin"), wheel=lambda: wheel)

    def test_the_dsn_quotes_a_data_dir_with_spaces_quotes_and_backslashes(self):
        datadir = "/tmp/a b/it's\\x/pg"
        self.assertEqual(psycopg.conninfo.conninfo_to_dict(Cluster(Path(datadir)).dsn)["host"], datadir)

    def test_path_first_through_a_symlink_to_the_real_directory(self):
        real = self.server("lib/postgresql/9/bin")
        self.server("lib/postgresql/16/bin")
        onpath = self.tmp / "usr-local-bin"
        onpath.mkdir()
        (onpath / "pg_ctl").symlink_to(real / "pg_ctl")     # e.g. /usr/local/bin/pg_ctl alone
        self.assertEqual(self.find(f"/nonexistent:{onpath}", self.server("wheel/bin")), real)

    def test_a_path_entry_closed_to_this_user_is_skipped(self):
        """/root/bin on root's PATH, kept by runuser: stat inside it fails with EACCES."""
        closed = self.tmp / "closed"
        closed.mkdir(mode=0o700)
        system = self.server("lib/postgresql/15/bin")
        script = ("import sys; sys.path.insert(0, sys.argv[1]); from ias.pgcluster import find_bindir; "
                  "print(find_bindir(path=sys.argv[2], system=sys.argv[3], wheel=lambda: None))")
        os.chmod(self.tmp, 0o755)
        who = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
        if not who:
            closed.chmod(0)                              # not root: closed to ourselves
            self.addCleanup(closed.chmod, 0o700)
        python = sys.executable if not who else shutil.which("python3", path="/usr/bin:/bin")
        done = subprocess.run([python, "-c", script, str(REPO), f"{closed}:/nonexistent",
                               str(self.tmp / "lib/postgresql/*/bin")], cwd="/", capture_output=True, text=True,
                              timeout=60, **who)
        self.assertEqual(done.stdout.strip(), str(system), done.stderr)

    def test_a_path_entry_without_initdb_is_skipped(self):
        self.server("client/bin", programs=("pg_ctl",))
        system = self.server("lib/postgresql/15/bin")
        self.assertEqual(self.find(str(self.tmp / "client/bin")), system)

    def test_the_newest_system_version_before_the_wheel(self):
        self.server("lib/postgresql/9/bin")
        newest = self.server("lib/postgresql/15/bin")
        self.server("lib/postgresql/13/bin", programs=("pg_ctl",))
        self.assertEqual(self.find("", self.server("wheel/bin")), newest)

    def test_the_wheel_when_nothing_else(self):
        self.server("lib/postgresql/16/bin", programs=("initdb", "pg_ctl"))      # no server binary
        wheel = self.server("wheel/bin")
        self.assertEqual(self.find("", wheel), wheel)

    def test_nothing_names_both_ways_to_get_binaries(self):
        with self.assertRaises(ClusterError) as raised:
            self.find("", self.tmp / "absent")
        self.assertIn("apt-get install postgresql", str(raised.exception))
        self.assertIn("pip install pgserver", str(raised.exception))

    def test_the_wheel_is_located_without_importing_it(self):
        package = self.tmp / "site" / "pgserver"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
        sys.path.insert(0, str(self.tmp / "site"))
        try:
            importlib.invalidate_caches()
            self.assertEqual(wheel_bindir(), package / "pginstall" / "bin")
            self.assertNotIn("pgserver", sys.modules)
        finally:
            sys.path.remove(str(self.tmp / "site"))
            importlib.invalidate_caches()


if __name__ == "__main__":
    unittest.main()

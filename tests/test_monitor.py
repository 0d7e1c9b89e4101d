"""The database monitor (reconnect with backoff, restart, give up after the limit) and the low-disk watch."""
import asyncio
import logging
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

from ias.doctor import disk_line
from ias.errors import StoreError
from ias.monitor import DatabaseMonitor, DiskWatch, low_disk
from ias.store import Store
from tests.support import capture_logs, server_dsn


class MonitorTest(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls):
        server_dsn()

    async def asyncSetUp(self):
        self.records = capture_logs(self)
        self.gone: list[str] = []
        nowhere = tempfile.TemporaryDirectory(prefix="ias-nodb-")     # a socket directory with no server
        self.addCleanup(nowhere.cleanup)
        self.unreachable = f"host={nowhere.name} port=5432 dbname=postgres user=postgres"

    def monitor(self, store: Store, restart=None, limit: float = 0.3) -> DatabaseMonitor:
        monitor = DatabaseMonitor(store, self.gone.append, restart=restart, limit=limit, first_delay=0.02,
                                  max_delay=0.05)
        task = asyncio.create_task(monitor.run())
        self.addAsyncCleanup(self.cancel, task)
        return monitor

    @staticmethod
    async def cancel(task: asyncio.Task) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def test_a_reachable_database_is_no_outage(self):
        store = Store(server_dsn())
        self.addAsyncCleanup(store.close)
        monitor = self.monitor(store)
        self.assertFalse(await asyncio.wait_for(monitor.settle(), 5))
        self.assertTrue(monitor.available)
        self.assertEqual(self.gone, [])

    async def test_reconnects_after_restarting_the_server(self):
        store = Store(self.unreachable)
        self.addAsyncCleanup(store.close)
        restarts = []

        def restart():                      # the second "restart" brings the database back
            restarts.append(1)
            if len(restarts) == 2:
                store.dsn = server_dsn()
        monitor = self.monitor(store, restart, limit=10)
        settled = asyncio.create_task(monitor.settle())
        while monitor.available:
            await asyncio.sleep(0.005)
        self.assertTrue(await asyncio.wait_for(settled, 5))
        self.assertTrue(monitor.available)
        self.assertEqual((len(restarts), self.gone), (2, []))
        self.assertTrue(any("database reachable again" in r.getMessage() for r in self.records))

    async def test_gives_up_after_the_limit_with_one_line(self):
        store = Store(self.unreachable)
        self.addAsyncCleanup(store.close)
        monitor = self.monitor(store, limit=0.3)
        monitor.suspect()
        for _ in range(400):
            if self.gone:
                break
            await asyncio.sleep(0.01)
        self.assertEqual(len(self.gone), 1)
        self.assertFalse(monitor.available)
        critical = [r for r in self.records if r.levelno == logging.CRITICAL]
        self.assertEqual(len(critical), 1)
        self.assertIn("database unreachable for", critical[0].getMessage())


    async def test_restarts_back_off_while_connection_attempts_stay_frequent(self):
        store = Store(self.unreachable)
        self.addAsyncCleanup(store.close)
        restarts, attempts = [], []
        reconnect = store.reconnect

        async def counted():
            attempts.append(time.monotonic())
            await reconnect()
        store.reconnect = counted
        monitor = DatabaseMonitor(store, self.gone.append, restart=lambda: restarts.append(time.monotonic()),
                                  limit=1.5, first_delay=0.05, max_delay=0.1, restart_delay=0.8)
        task = asyncio.create_task(monitor.run())
        self.addAsyncCleanup(self.cancel, task)
        monitor.suspect()
        await asyncio.wait_for(self.until_gone(), 10)
        # A server that cannot start is not hammered (0, .05, .15, .35, .75, 1.35 s) ...
        self.assertLessEqual(len(restarts), 7)
        # ... while one that comes back is seen within max_delay: attempts never more than ~0.1 s apart.
        self.assertGreater(len(attempts), 12)
        self.assertLess(max(b - a for a, b in zip(attempts[1:], attempts[2:])), 0.3)

    async def until_gone(self) -> None:
        while not self.gone:
            await asyncio.sleep(0.01)


def fake_statvfs(free: list[float]):
    """A statvfs whose free share is the head of `free` (the last value stays)."""
    def statvfs(path: str):
        share = free.pop(0) if len(free) > 1 else free[0]
        return SimpleNamespace(f_frsize=4096, f_blocks=1_000_000, f_bavail=int(1_000_000 * share))
    return statvfs


class DiskWatchTest(unittest.IsolatedAsyncioTestCase):
    async def test_the_owner_is_warned_once_when_free_space_falls_below_5_percent(self):
        told = []

        async def tell(text: str) -> None:
            told.append(text)
        watch = DiskWatch(Path(tempfile.gettempdir()), tell, statvfs=fake_statvfs([0.2, 0.04, 0.03, 0.02, 0.3, 0.01]))
        for _ in range(6):
            await watch.check()
        self.assertEqual(len(told), 2)                  # once, and once more after it recovered and fell again
        self.assertTrue(told[0].startswith("磁盘空间不足：数据目录所在分区仅剩 4.0%（可用 156.2 MB，共 3.8 GB；"), told[0])
        self.assertTrue(told[1].startswith("磁盘空间不足：数据目录所在分区仅剩 1.0%"), told[1])

    async def test_a_warning_that_cannot_be_queued_is_tried_again(self):
        told = []

        async def tell(text: str) -> None:
            if not told:
                told.append(None)
                raise StoreError("database down")
            told.append(text)
        watch = DiskWatch(Path(tempfile.gettempdir()), tell, statvfs=fake_statvfs([0.01]))
        for _ in range(3):
            await watch.check()
        self.assertEqual(len([t for t in told if t]), 1)

    async def test_the_daemon_loop_checks_periodically(self):
        told = []

        async def tell(text: str) -> None:
            told.append(text)
        watch = DiskWatch(Path("/nonexistent/data"), tell, statvfs=fake_statvfs([0.5, 0.5, 0.02]), interval=0.01)
        task = asyncio.create_task(watch.run())
        try:
            while not told:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
        self.assertEqual(len(told), 1)
        self.assertIn("/nonexistent/data", told[0])

    def test_plenty_of_space_is_no_warning(self):
        self.assertIsNone(low_disk(Path(tempfile.gettempdir()), fake_statvfs([0.05])))


class DoctorDiskLineTest(unittest.TestCase):
    def test_doctor_warns_below_5_percent(self):
        data = Path(tempfile.gettempdir()) / "no-such-ias-dir"
        ok, what, detail = disk_line(data, fake_statvfs([0.5]))
        self.assertEqual((ok, what), (True, "disk"))
        ok, what, detail = disk_line(data, fake_statvfs([0.02]))
        self.assertEqual((ok, what), (None, "disk"))              # a warning, not a failure
        self.assertIn("2.0% free under", detail)
        self.assertIn("below 5%", detail)


if __name__ == "__main__":
    unittest.main()

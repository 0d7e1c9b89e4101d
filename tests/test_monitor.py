"""The database monitor (reconnect with backoff, restart, give up after the limit) and the supervisor."""
import asyncio
import logging
import tempfile
import unittest

from ias.monitor import DatabaseMonitor
from ias.store import Store
from ias.supervisor import Supervisor
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


class SupervisorTest(unittest.IsolatedAsyncioTestCase):
    async def test_a_crash_is_logged_with_its_traceback_and_fails_the_daemon(self):
        records = capture_logs(self)
        supervisor = Supervisor()

        async def crash():
            raise ValueError("boom")
        supervisor.spawn(crash(), "cruncher")
        await asyncio.wait_for(supervisor.failed.wait(), 5)
        self.assertIn("cruncher", supervisor.reason)
        (record,) = [r for r in records if r.levelno == logging.CRITICAL]
        self.assertEqual(record.exc_info[0], ValueError)

    async def test_cancelled_and_finished_tasks_are_no_failure(self):
        supervisor = Supervisor()
        done = supervisor.spawn(asyncio.sleep(0), "short")
        forever = supervisor.spawn(asyncio.Event().wait(), "forever")
        await done
        await supervisor.cancel(5)
        self.assertTrue(forever.cancelled())
        self.assertFalse(supervisor.failed.is_set())


if __name__ == "__main__":
    unittest.main()

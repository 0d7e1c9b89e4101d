"""The clock: the owner's zone and the real clocks (the fake in tests/support.py stands in for them)."""
import inspect
import time
import unittest
from datetime import datetime, timedelta, timezone

from ias import approval, clock, outbox, scheduler
from ias.clock import SYSTEM, TZ, Clock
from tests.support import FakeClock


class ClockTest(unittest.TestCase):
    def test_the_zone_is_beijing_time(self):
        self.assertEqual(str(TZ), "Asia/Shanghai")
        self.assertEqual(datetime(2026, 7, 1, tzinfo=TZ).utcoffset(), timedelta(hours=8))     # no summer time
        self.assertEqual(datetime(2026, 1, 1, tzinfo=TZ).utcoffset(), timedelta(hours=8))
        self.assertEqual(clock.ZONE_NAME, "Asia/Shanghai")

    def test_now_is_aware_utc_and_monotonic_is_the_systems(self):
        before = datetime.now(timezone.utc)
        now = Clock().now()
        self.assertEqual(now.utcoffset(), timedelta(0))
        self.assertLessEqual(before, now)
        self.assertLessEqual(now, datetime.now(timezone.utc))
        low = time.monotonic()
        self.assertTrue(low <= SYSTEM.monotonic() <= time.monotonic())

    def test_the_fake_has_the_clocks_interface(self):
        real = {name for name, _ in inspect.getmembers(Clock, inspect.isfunction) if not name.startswith("_")}
        self.assertEqual(real, {"now", "monotonic"})
        fake = FakeClock(datetime(2026, 3, 2, 5, tzinfo=TZ))
        for name in real:
            self.assertEqual(inspect.signature(getattr(fake, name)), inspect.signature(getattr(SYSTEM, name)))
        fake.advance(90)
        self.assertEqual((fake.now(), fake.monotonic()), (datetime(2026, 3, 2, 5, 1, 30, tzinfo=TZ), 1090.0))
        fake.at -= timedelta(hours=1)                   # a wall-clock jump leaves the monotonic clock alone
        self.assertEqual(fake.monotonic(), 1090.0)

    def test_a_stamp_is_beijing_time_with_its_zone(self):
        moment = datetime(2026, 12, 3, 6, 0, 5, tzinfo=timezone.utc)
        zone = moment.astimezone(TZ).tzname()
        self.assertIn(zone, ("CST", "Asia/Shanghai"))           # tzdata's abbreviation, else the fallback's name
        self.assertEqual(clock.stamp(moment), f"2026-12-03 14:00:05 {zone}")
        self.assertEqual(clock.stamp(moment.astimezone(timezone(timedelta(hours=-5))), seconds=False),
                         f"2026-12-03 14:00 {zone}")

    def test_the_modules_default_to_the_real_clock(self):
        """Where a module takes a clock, its default is clock.SYSTEM's, never a clock of its own."""
        for function, names in ((scheduler.Scheduler.__init__, ("now", "monotonic")),
                                (scheduler.prune_daily, ("now",)),
                                (outbox.Outbox.__init__, ("now", "monotonic")),
                                (approval.Approvals.__init__, ("monotonic",))):
            parameters = inspect.signature(function).parameters
            for name in names:
                with self.subTest(function=function.__qualname__, name=name):
                    self.assertEqual(parameters[name].default, getattr(SYSTEM, name))


if __name__ == "__main__":
    unittest.main()

"""Time: the owner's zone and the one clock every module reads (wall and monotonic), injectable.

The zone is Asia/Shanghai (Beijing time), the owner's and the schedules': `TZ` from the system's
tzdata, or a fixed +08:00 zone of the same name without it (Shanghai has kept +08:00 since 1991).
`Clock` reads the wall clock (aware UTC datetimes: the database stores them, and they compare
across zones) and the monotonic clock (timers and deadlines that a wall-clock jump must not move).
Modules take its bound methods (`now=`, `monotonic=`); tests pass those of `tests.support.FakeClock`.

Not handled: any other zone (a setting for it, per-user zones), DST rules (Shanghai has none), leap
seconds. Presenting times in the owner's messages is the scheduler's (`scheduler.when_text`); `stamp` is
the form of the command-line listings (Beijing time with its zone, whatever the machine's zone is).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

ZONE_NAME = "Asia/Shanghai"     # also every skill's TZ variable

try:
    TZ = ZoneInfo(ZONE_NAME)
except ZoneInfoNotFoundError:   # no tzdata on the system and no tzdata package
    TZ = timezone(timedelta(hours=8), ZONE_NAME)


@dataclass(frozen=True, slots=True)
class Clock:
    """The real clocks: `now()` the wall time (aware, UTC), `monotonic()` seconds that never jump."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = Clock()            # stateless: the default of every `now=` and `monotonic=`


def stamp(moment: datetime, seconds: bool = True) -> str:
    """`moment` as a person reads it in a listing: Beijing time with its zone (`2026-12-03 14:00:05 CST`)."""
    local = moment.astimezone(TZ)
    return local.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")

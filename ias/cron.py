"""Cron expressions and the scheduler's schedule language, in Asia/Shanghai time.

`next_after(expr, after)` gives the next firing time of a 5-field cron expression
(minute hour day-of-month month day-of-week) strictly after `after`. Supported: `*`,
numbers, lists, ranges, steps (`*/15`, `1-30/5`, `5/10` = `5-max/10`), month names
JAN-DEC and weekday names SUN-SAT (case-insensitive, also in ranges), weekday 0 and 7
both Sunday, and @yearly/@annually, @monthly, @weekly, @daily/@midnight, @hourly.
Day rule (Vixie cron): when both day fields are restricted, a day matches if either
matches; when either starts with `*`, a day must match both (so a plain `*` leaves
only the other field).

`parse_schedule(text)` accepts a cron expression, a one-shot time
(`2026-12-24 08:00[:30]`, `T` separator, optional UTC offset; naive = Shanghai) or an
interval (`every N[smhd]`, at least 10 s, at most 365 days).

Every invalid schedule raises CronError (a ValueError) with a short message; so do
schedules and searches that would leave the years 1-9999 datetime can represent.

Deliberately not handled: a seconds (or year) field; the L, W, # and ? extensions;
@reboot; DST gaps and folds beyond a best effort (Asia/Shanghai has had a fixed +08:00
offset since 1991, and the fallback zone is fixed-offset). Cron fields and naive
datetimes are Shanghai wall time; every returned datetime is aware, in `TZ` (clock.py's zone).
"""
from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache

from .clock import TZ
from .limits import CRON_SEARCH_YEARS

# A search that finds nothing in CRON_SEARCH_YEARS (400, the Gregorian cycle: weekdays and
# leap years repeat exactly) means the expression never fires. Feb 29 on a Sunday can be
# 40 years away; the search jumps by month and day, so 400 years take a few hundred steps.


class CronError(ValueError):
    """An invalid schedule or one without a firing time; the message is short and says why."""


def _clip(text: str, limit: int = 40) -> str:
    """Echo of the user's text in a message, cut short."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"

_LAST_MINUTE = datetime(9999, 12, 31, 23, 59)
MIN_INTERVAL = timedelta(seconds=10)
MAX_INTERVAL = timedelta(days=365)

_FIELDS = (
    # name, low, high, names
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, {m: i for i, m in enumerate(
        "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), 1)}),
    ("day-of-week", 0, 7, {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}),
)
NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # by month, leap Feb
_MONTH_ABBR = (None, "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")


def to_tz(dt: datetime) -> datetime:
    """`dt` as an aware datetime in TZ; a naive `dt` is taken as Shanghai wall time."""
    if dt.tzinfo is None or dt.tzinfo.utcoffset(dt) is None:
        return dt.replace(tzinfo=TZ)
    return dt.astimezone(TZ)


@dataclass(frozen=True, slots=True)
class _Cron:
    """A parsed cron expression: sorted allowed values per field."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: tuple[int, ...]
    dows: frozenset[int]
    either_day: bool  # both day fields restricted: a day matches if either matches
    dom_list: tuple[int, ...] = ()  # doms, sorted: the search jumps to the next allowed day

    def day_ok(self, y: int, m: int, d: int) -> bool:
        """Whether the day y-m-d matches the day-of-month/day-of-week rule."""
        dom_ok = d in self.doms
        dow_ok = (date(y, m, d).weekday() + 1) % 7 in self.dows
        return (dom_ok or dow_ok) if self.either_day else (dom_ok and dow_ok)


def _number(token: str, low: int, high: int, names: dict[str, int] | None, fail) -> int:
    """One value of a field: digits or (month/weekday fields) a name."""
    if token.isdigit() and token.isascii():
        if len(token) > 4:
            fail(f"value {token[:8]}… out of range {low}-{high}")
        value = int(token)
    elif names is not None and token.upper() in names:
        return names[token.upper()]
    else:
        if token == "":
            fail("missing value")
        if re.fullmatch(r"\d*L|\d*W|LW|\?|\d*#\d*", token.upper()):
            fail("the L, W, # and ? extensions are not supported")
        what = f"a number {low}-{high}"
        if names is not None:
            what += " or a name " + ", ".join(sorted(names, key=names.get))
        fail(f"bad value {token!r}, expected {what}")
    if not low <= value <= high:
        fail(f"value {value} out of range {low}-{high}")
    return value


def _parse_field(text: str, index: int, expr: str) -> tuple[set[int], bool]:
    """A field's allowed values, and whether it starts with `*`."""
    name, low, high, names = _FIELDS[index]

    def fail(problem: str):
        raise CronError(f"cron expression {_clip(expr)}: {name} field {_clip(text, 20)}: {problem}")

    values: set[int] = set()
    for item in text.split(","):
        if item == "":
            fail("empty list item")
        base, slash, step_text = item.partition("/")
        if slash:
            if not (step_text.isdigit() and step_text.isascii() and len(step_text) <= 4):
                fail(f"bad step {_clip(step_text, 8)}, expected a positive number up to 9999")
            step = int(step_text)
            if step == 0:
                fail("step must be at least 1")
        else:
            step = 1
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _number(first, low, high, names, fail)
            end = _number(last, low, high, names, fail)
            if start > end:
                hint = " (use 7 for Sunday at the end of a range, e.g. 5-7)" if index == 4 else ""
                fail(f"reversed range {start}-{end}{hint}")
        else:
            start = _number(base, low, high, names, fail)
            end = high if slash else start  # `5/10` means 5-max/10
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return values, text.startswith("*")


@lru_cache(maxsize=512)
def _parse(expr: str) -> _Cron:
    """Parse and check a cron expression (cached; results are immutable)."""
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in NICKNAMES:
            raise CronError(f"cron expression {_clip(expr)}: unknown nickname {_clip(text, 20)}, expected one of "
                             + ", ".join(NICKNAMES))
        text = NICKNAMES[text.lower()]
    fields = text.split()
    if len(fields) != 5:
        raise CronError(f"cron expression {_clip(expr)}: expected 5 fields (minute hour day-of-month "
                         f"month day-of-week), got {len(fields)}")
    parsed = [_parse_field(f, i, expr) for i, f in enumerate(fields)]
    (minutes, _), (hours, _), (doms, dom_star), (months, _), (dows, dow_star) = parsed
    cron = _Cron(tuple(sorted(minutes)), tuple(sorted(hours)), frozenset(doms),
                 tuple(sorted(months)), frozenset(dows), not dom_star and not dow_star, tuple(sorted(doms)))
    # When the day-of-month field must match, some chosen month has to have that day.
    if not cron.either_day and not any(d <= _MAX_DAYS[m] for m in months for d in doms):
        raise CronError(
            f"cron expression {_clip(expr)} never fires: day-of-month {','.join(map(str, sorted(doms)))} "
            f"does not occur in {','.join(_MONTH_ABBR[m] for m in cron.months)}")
    return cron


def _first_ge(values: tuple[int, ...], x: int) -> int | None:
    """The smallest value >= x, or None."""
    i = bisect_left(values, x)
    return values[i] if i < len(values) else None


def _search(cron: _Cron, start: datetime) -> datetime | None:
    """The first matching naive wall time >= start (whole minutes), or None within the horizon."""
    y, mo, d, h, mi = start.year, start.month, start.day, start.hour, start.minute
    last_year = min(y + CRON_SEARCH_YEARS, 9999)
    while y <= last_year:
        if mo not in cron.months:
            nxt = _first_ge(cron.months, mo)
            if nxt is None:
                y, mo = y + 1, cron.months[0]
            else:
                mo = nxt
            d, h, mi = 1, 0, 0
            continue
        hour = _first_ge(cron.hours, h)
        if hour is None or not cron.day_ok(y, mo, d):
            d, h, mi = d + 1, 0, 0
            if not cron.either_day:   # the day-of-month must match: jump to the next allowed one
                d = _first_ge(cron.dom_list, d) or 32
            if d > calendar.monthrange(y, mo)[1]:
                d, mo = 1, mo + 1
                if mo > 12:
                    y, mo = y + 1, 1
            continue
        if hour != h:
            h, mi = hour, 0
        minute = _first_ge(cron.minutes, mi)
        if minute is None:
            h, mi = h + 1, 0
            continue
        return datetime(y, mo, d, h, minute)
    return None


def _aware(dt: datetime) -> datetime:
    """to_tz(), with a time outside what datetime can hold in TZ as a CronError."""
    try:
        return to_tz(dt)
    except OverflowError:
        raise CronError(f"time {dt} is out of range (years 1-9999 in Asia/Shanghai)") from None


def next_after(expr: str, after: datetime) -> datetime:
    """The next firing time of cron `expr` strictly after `after`, aware, in Asia/Shanghai."""
    cron = _parse(expr)
    after = _aware(after)
    wall = after.replace(tzinfo=None, second=0, microsecond=0, fold=0)
    while True:
        found = _search(cron, wall + timedelta(minutes=1)) if wall < _LAST_MINUTE else None
        if found is None:
            if wall.year + CRON_SEARCH_YEARS > 9999:
                raise CronError(f"cron expression {_clip(expr)}: no firing time after "
                                f"{after:%Y-%m-%d %H:%M} before the year 10000")
            raise CronError(f"cron expression {_clip(expr)} never fires")
        result = found.replace(tzinfo=TZ)
        if result > after:
            return result
        # Only reachable with a historical DST fold: that wall time maps to an earlier instant.
        wall = found


# ---- the scheduler's schedule language -------------------------------------------------

_EVERY = re.compile(r"every\s+(\d+)\s*([smhd])", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ONCE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}(:?\d{2})?)?", re.IGNORECASE)
_CRON_TOKEN = re.compile(r"[0-9A-Za-z*/,\-?#]+")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed task schedule: kind "cron", "once" or "every", with its normalised text.

    For "every", runs lie on the grid anchor, anchor + i, anchor + 2i, ... (i the
    interval, `anchor` typically the task's creation time): next_after(after) is the
    first grid point strictly after `after`, so a task created at 08:00 with `every 1h`
    first fires at 09:00, and after a downtime it catches up on the next grid point
    (after 10:30 -> 11:00), not at restart + i. Without an anchor it is after + i.
    `anchor` is ignored by the other kinds. Schedule(kind, text, anchor) may also be
    built directly from stored values; the text is re-parsed (cached) when used.
    """

    kind: str
    text: str
    anchor: datetime | None = None

    def next_after(self, after: datetime) -> datetime | None:
        """The next run strictly after `after` (aware, TZ); None for a one-shot already past."""
        after = _aware(after)
        if self.kind == "cron":
            return next_after(self.text, after)
        if self.kind == "once":
            at = _once_at(self.text)
            return at if at > after else None
        if self.kind != "every":
            raise CronError(f"unknown schedule kind {_clip(str(self.kind))}")
        # Interval arithmetic in UTC, so it stays right across any offset change.
        step = _every_interval(self.text)
        try:
            if self.anchor is None:
                return (after.astimezone(timezone.utc) + step).astimezone(TZ)
            anchor = _aware(self.anchor).astimezone(timezone.utc)
            delta = after - anchor
            k = delta // step + 1 if delta >= timedelta(0) else 0
            return (anchor + k * step).astimezone(TZ)
        except OverflowError:
            raise CronError(f"interval {_clip(self.text)}: no run after {after:%Y-%m-%d %H:%M} "
                            "before the year 10000") from None


@lru_cache(maxsize=256)
def _every_interval(text: str) -> timedelta:
    """The length of an `every N[smhd]` interval."""
    m = _EVERY.fullmatch(" ".join(text.split()))
    if m is None:
        raise CronError(f"bad interval {_clip(text)}: expected 'every N' with a unit s, m, h or d, "
                        "e.g. 'every 30m', 'every 2h', 'every 1d'")
    digits, unit = m.group(1).lstrip("0") or "0", m.group(2).lower()
    if len(digits) > 9 or int(digits) > MAX_INTERVAL.total_seconds() // _UNITS[unit]:
        raise CronError(f"bad interval {_clip(text)}: at most {MAX_INTERVAL.days} days")
    n = int(digits)
    interval = timedelta(seconds=n * _UNITS[unit])
    if interval < MIN_INTERVAL:
        raise CronError(f"bad interval {_clip(text)}: at least {MIN_INTERVAL.seconds} seconds")
    return interval


@lru_cache(maxsize=256)
def _once_at(text: str) -> datetime:
    """A one-shot time, aware in TZ; naive means Shanghai wall time."""
    text = " ".join(text.split())
    if _ONCE.fullmatch(text) is None:
        raise CronError(f"bad one-shot time {_clip(text)}: expected 'YYYY-MM-DD HH:MM[:SS]', "
                        "optionally with 'T' and a UTC offset like +08:00")
    try:
        return to_tz(datetime.fromisoformat(text.upper()))
    except ValueError as exc:
        raise CronError(f"bad one-shot time {_clip(text)}: {exc}") from None
    except OverflowError:
        raise CronError(f"bad one-shot time {_clip(text)}: out of range (years 1-9999 in Asia/Shanghai)") from None


def parse_schedule(text: str, *, anchor: datetime | None = None) -> Schedule:
    """Parse a cron expression, @nickname, one-shot time or `every N[smhd]` interval."""
    text = " ".join(str(text).split())
    if not text:
        raise CronError("empty schedule: expected a cron expression, a one-shot time or 'every N[smhd]'")
    if text.lower().startswith("every"):
        _every_interval(text)  # validates
        m = _EVERY.fullmatch(text)
        return Schedule("every", f"every {int(m.group(1).lstrip('0') or '0')}{m.group(2).lower()}", anchor)
    if re.match(r"\d{4}-", text):
        at = _once_at(text)
        return Schedule("once", at.strftime("%Y-%m-%d %H:%M:%S" if at.second else "%Y-%m-%d %H:%M"),
                        anchor)
    tokens = text.split()
    if text.startswith("@") or (2 <= len(tokens) <= 7 and all(map(_CRON_TOKEN.fullmatch, tokens))):
        _parse(text)
        return Schedule("cron", text.lower() if text.startswith("@") else text, anchor)
    raise CronError(f"unrecognised schedule {_clip(text)}: expected a 5-field cron expression "
                     "('0 8 * * *'), an @nickname ('@daily'), a one-shot time ('2026-12-24 08:00') "
                     "or an interval ('every 30m')")


def describe(schedule: Schedule | str, after: datetime, n: int = 3) -> list[datetime]:
    """The next `n` run times after `after`, ascending (fewer for a one-shot)."""
    if isinstance(schedule, str):
        schedule = parse_schedule(schedule)
    times: list[datetime] = []
    t = _aware(after)
    while len(times) < n:
        nxt = schedule.next_after(t)
        if nxt is None:
            break
        times.append(nxt)
        t = nxt
    return times

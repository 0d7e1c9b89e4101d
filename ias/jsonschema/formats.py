"""The `format` values the validator checks: date, time, date-time, email, ipv4, uri.

Others are accepted unchecked (JSON Schema makes `format` an annotation by default; these are
the ones skills use). Dates and times follow RFC 3339: a real calendar day, a required Z or
±HH:MM offset, second 60 only at 23:59 UTC (a leap second). `email` is deliberately loose (one
@, a dotted domain, no spaces); `uri` asks only for a scheme.
"""
from __future__ import annotations

import re
from collections.abc import Callable

# Field ranges are in the expressions; only day-of-month and leap seconds need code.
_DATE = r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = (r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)(?:\.[0-9]+)?"
         r"(?:[Zz]|([+-])([01][0-9]|2[0-3]):([0-5][0-9]))")
_DATE_RE = re.compile(_DATE)
_TIME_RE = re.compile(_TIME)
_DATE_TIME_RE = re.compile(_DATE + "[Tt]" + _TIME)
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s.]+(?:\.[^@\s.]+)+")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S*")


def _day_ok(s: str) -> bool:
    """Given a string starting YYYY-MM-DD that matched _DATE, is that day in its month?"""
    day = s[8:10]
    if day <= "28":
        return True
    month = s[5:7]
    if month == "02":
        y = int(s[:4])
        return day == "29" and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return day != "31" or month in ("01", "03", "05", "07", "08", "10", "12")


def _second_ok(hour: str, minute: str, second: str, sign: str | None,
               off_h: str | None, off_m: str | None) -> bool:
    """Allow second 60 only when the time is 23:59 in UTC (a leap second)."""
    if second != "60":
        return True
    offset = (int(off_h) * 60 + int(off_m)) * (-1 if sign == "-" else 1) if sign else 0
    return (int(hour) * 60 + int(minute) - offset) % 1440 == 23 * 60 + 59


# The expressions fix the field widths, so fields can be sliced at known positions.
def _is_date(s: str) -> bool:
    """RFC 3339 full-date on a real calendar day."""
    return _DATE_RE.fullmatch(s) is not None and _day_ok(s)


def _is_time(s: str) -> bool:
    """RFC 3339 full-time: HH:MM:SS[.frac] plus a required Z or ±HH:MM offset."""
    m = _TIME_RE.fullmatch(s)
    return m is not None and (s[6:8] != "60" or _second_ok(*m.groups()))


def _is_date_time(s: str) -> bool:
    """RFC 3339 date-time with a T or t separator."""
    m = _DATE_TIME_RE.fullmatch(s)
    return (m is not None and _day_ok(s)
            and (s[17:19] != "60" or _second_ok(*m.groups()[3:])))


# A test returns something truthy for a valid string.
FORMATS: dict[str, tuple[Callable[[str], object], str]] = {
    "date": (_is_date, "date (YYYY-MM-DD)"),
    "time": (_is_time, "time (HH:MM:SS with a Z or ±HH:MM offset)"),
    "date-time": (_is_date_time, "date-time (YYYY-MM-DDTHH:MM:SS with a Z or ±HH:MM offset)"),
    "email": (_EMAIL_RE.fullmatch, "email address"),
    "ipv4": (_IPV4_RE.fullmatch, "IPv4 address"),
    "uri": (_URI_RE.fullmatch, "URI (with a scheme such as https:)"),
}

"""A local QWeather (和风天气) API: GeoAPI city lookup, current weather and the 3-day forecast.

Written from the protocol notes (shared/reference/web-apis.md):
- auth is the `X-QW-Api-Key` header; a wrong or missing key answers `{"code": "401"}`
  (or, with `auth_style="http"`, the newer HTTP 401 with an `error` object); sending a
  second auth method (`Authorization`) at the same time is refused with code 400;
- every answer is gzip-compressed JSON with `Content-Encoding: gzip`, as the real API does
  (whatever the client asked for; `requests[i].headers` shows what it asked);
- `/geo/v2/city/lookup?location=…&number=…&lang=…[&adm=…]` matches by name (substring) or
  by LocationID, `adm` filtering on adm1/adm2; no match answers `{"code": "404"}`, or
  `{"code": "200", "location": []}` with `not_found="empty"`;
- `/v7/weather/now` and `/v7/weather/3d` need `location` = a known LocationID.

`script(path, status, body)` queues one canned answer for the next request to that path
(after the auth check), e.g. `{"code": "429"}`. `delay` seconds are slept before answering.
Every request is recorded in `requests` (method, path, query, headers).
"""
from __future__ import annotations

import threading
import time
import urllib.parse
from dataclasses import dataclass

from tests.servers import JSONHandler, JSONServer

KEY = "qw-test-key-0123456789"
UPDATE_TIME = "2025-01-15T10:02+08:00"

CITIES = [
    {"name": "北京", "id": "101010100", "lat": "39.90499", "lon": "116.40529", "adm2": "北京", "adm1": "北京市",
     "country": "中国", "tz": "Asia/Shanghai", "utcOffset": "+08:00", "type": "city", "rank": "10",
     "fxLink": "https://www.qweather.com/weather/beijing-101010100.html"},
    {"name": "朝阳", "id": "101010300", "lat": "39.92149", "lon": "116.48641", "adm2": "北京", "adm1": "北京市",
     "country": "中国", "tz": "Asia/Shanghai", "utcOffset": "+08:00", "type": "city", "rank": "15",
     "fxLink": "https://www.qweather.com/weather/chaoyang-101010300.html"},
    {"name": "朝阳", "id": "101071201", "lat": "41.57676", "lon": "120.45118", "adm2": "朝阳", "adm1": "辽宁省",
     "country": "中国", "tz": "Asia/Shanghai", "utcOffset": "+08:00", "type": "city", "rank": "23",
     "fxLink": "https://www.qweather.com/weather/chaoyang-101071201.html"},
]

NOW = {
    "101010100": {"obsTime": "2025-01-15T09:58+08:00", "temp": "-3", "feelsLike": "-8", "icon": "100", "text": "晴",
                  "wind360": "315", "windDir": "西北风", "windScale": "3", "windSpeed": "14", "humidity": "21",
                  "precip": "0.0", "pressure": "1030", "vis": "30", "cloud": "0", "dew": "-20"},
    "101010300": {"obsTime": "2025-01-15T09:58+08:00", "temp": "-2", "feelsLike": "-7", "icon": "100", "text": "晴",
                  "wind360": "310", "windDir": "西北风", "windScale": "3", "windSpeed": "13", "humidity": "22",
                  "precip": "0.0", "pressure": "1030", "vis": "30", "cloud": "0", "dew": "-19"},
    "101071201": {"obsTime": "2025-01-15T09:56+08:00", "temp": "-11", "feelsLike": "-17", "icon": "101",
                  "text": "多云", "wind360": "0", "windDir": "北风", "windScale": "2", "windSpeed": "9",
                  "humidity": "45", "precip": "0.0", "pressure": "1025", "vis": "20", "cloud": "40", "dew": "-21"},
}

REFER = {"sources": ["QWeather"], "license": ["QWeather Developers License"]}


def _daily(location: str, days: int) -> list[dict]:
    base = int(NOW[location]["temp"])
    texts = [("晴", "晴"), ("多云", "阴"), ("小雪", "多云"), ("晴", "多云"), ("阴", "阴"), ("晴", "晴"), ("多云", "晴")]
    return [{"fxDate": f"2025-01-{15 + i:02d}", "sunrise": "07:35", "sunset": "17:15", "moonPhase": "亏凸月",
             "tempMax": str(base + 4 + i), "tempMin": str(base - 6 + i), "iconDay": "100", "textDay": texts[i][0],
             "iconNight": "150", "textNight": texts[i][1], "wind360Day": "315", "windDirDay": "西北风",
             "windScaleDay": "3-4", "windSpeedDay": "16", "wind360Night": "0", "windDirNight": "北风",
             "windScaleNight": "1-3", "windSpeedNight": "3", "humidity": "30", "precip": "0.0", "pressure": "1028",
             "vis": "25", "cloud": "5", "uvIndex": "2"} for i in range(days)]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]          # last value of each query parameter
    headers: dict[str, str]        # header names lower-cased


class QWeatherServer(JSONServer):
    """`with QWeatherServer() as qw:` — `qw.base_url` for QWEATHER_API_HOST, `qw.key` for QWEATHER_API_KEY."""

    def __init__(self, key: str = KEY, not_found: str = "404", auth_style: str = "code", delay: float = 0.0):
        self.key = key
        self.not_found = not_found          # "404": {"code": "404"}; "empty": code 200 with no locations
        self.auth_style = auth_style        # "code": HTTP 200 {"code": "401"}; "http": HTTP 401 + error object
        self.delay = delay
        self.cities = list(CITIES)
        self.requests: list[Request] = []
        self._scripted: dict[str, list[tuple[int, dict]]] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(JSONHandler):
            def do_GET(self):
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                status, body = server._answer(Request("GET", parts.path, query, self.lowered_headers()))
                if server.delay:
                    time.sleep(server.delay)
                try:
                    self.send_json(status, body, gzipped=True, content_type="application/json; charset=utf-8")
                except (BrokenPipeError, ConnectionResetError):
                    pass            # the client gave up (a timeout test)

        self.listen(Handler)

    # -- scripting and inspection ---------------------------------------------------------

    def script(self, path: str, status: int = 200, body: dict | None = None) -> None:
        """Answer the next request to `path` with (status, body) instead of the normal answer."""
        with self._lock:
            self._scripted.setdefault(path, []).append((status, body if body is not None else {}))

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    # -- the API ----------------------------------------------------------------------------

    def _answer(self, request: Request) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(request)
            if request.headers.get("x-qw-api-key") != self.key:
                if self.auth_style == "http":
                    return 401, {"error": {"status": 401, "type": "https://dev.qweather.com/docs/resource/error-code/#unauthorized",
                                           "title": "Unauthorized", "detail": "Invalid or missing API key."}}
                return 200, {"code": "401"}
            if "authorization" in request.headers:
                return 200, {"code": "400"}          # two auth methods at once
            queue = self._scripted.get(request.path)
            if queue:
                return queue.pop(0)
        if request.path == "/geo/v2/city/lookup":
            return 200, self._lookup(request.query)
        if request.path == "/v7/weather/now":
            location = request.query.get("location", "")
            if location not in NOW:
                return 200, {"code": "400" if not location else "404"}
            return 200, {"code": "200", "updateTime": UPDATE_TIME,
                         "fxLink": f"https://www.qweather.com/weather/now-{location}.html",
                         "now": NOW[location], "refer": REFER}
        if request.path in ("/v7/weather/3d", "/v7/weather/7d"):
            location = request.query.get("location", "")
            if location not in NOW:
                return 200, {"code": "400" if not location else "404"}
            days = 3 if request.path.endswith("3d") else 7
            return 200, {"code": "200", "updateTime": UPDATE_TIME,
                         "fxLink": f"https://www.qweather.com/weather/{location}.html",
                         "daily": _daily(location, days), "refer": REFER}
        return 404, {"error": {"status": 404, "title": "Not Found", "detail": f"no such endpoint: {request.path}"}}

    def _lookup(self, query: dict[str, str]) -> dict:
        location = query.get("location", "").strip()
        if not location:
            return {"code": "400"}
        try:
            number = int(query.get("number", "10"))
        except ValueError:
            return {"code": "400"}
        adm = query.get("adm", "")
        found = [c for c in self.cities
                 if (location == c["id"] or location in c["name"])
                 and (not adm or adm in c["adm1"] or adm in c["adm2"])]
        if not found:
            return {"code": "404"} if self.not_found == "404" else {"code": "200", "location": [], "refer": REFER}
        return {"code": "200", "location": found[:max(1, min(number, 20))], "refer": REFER}

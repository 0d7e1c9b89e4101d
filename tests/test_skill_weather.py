"""The weather skills (query_weather, user skill query_qweather) end to end against a local QWeather.

Each call goes through the real gate (schema, audit rows in PostgreSQL) and the runner (a real
`bash -c` + `$IAS_PYTHON` subprocess with the environment built from scratch); the script talks
HTTP to tests/servers/qweather.py, which answers gzip-compressed JSON like the real API.
"""
from __future__ import annotations

import unittest

from tests.servers import closed_port
from tests.servers.qweather import KEY, QWeatherServer
from tests.support import REPO, SkillsTestCase, load_script

WEATHER_SCRIPT = REPO / "resources/skills/query_weather/scripts/weather_now.py"
FORECAST_SCRIPT = REPO / "skills/query_qweather/scripts/forecast.py"


class WeatherCase(SkillsTestCase):
    server_options: dict = {}

    async def asyncSetUp(self) -> None:
        self.qw = QWeatherServer(**self.server_options).start()
        self.addCleanup(self.qw.close)
        await super().asyncSetUp()

    def runner_environ(self, **env: str | None) -> dict[str, str]:
        """The runner's environment, with `env` set (None: unset) over the usual QWeather set-up."""
        environ = {**super().runner_environ(), "QWEATHER_API_HOST": self.qw.base_url, "QWEATHER_API_KEY": KEY,
                   "OPENAI_API_KEY": "sk-must-not-leak", **env}
        return {k: v for k, v in environ.items() if v is not None}

    async def call(self, name: str, params, **env: str | None) -> dict:
        gate = self.gate
        if env:
            gate = self.build(environ=self.runner_environ(**env)).gate
        return await gate.call("owner", name, params)


class QueryWeatherTest(WeatherCase):
    async def test_current_weather(self):
        result = await self.call("query_weather", {"city": "北京"})
        self.assertIs(result["success"], True, result)
        self.assertEqual(result["city"], {"name": "北京", "adm1": "北京市", "adm2": "北京", "country": "中国",
                                          "id": "101010100"})
        now = result["now"]
        for field in ("obsTime", "temp", "feelsLike", "text", "windDir", "windScale", "humidity", "precip"):
            self.assertIn(field, now)
        self.assertEqual((now["temp"], now["text"], now["windDir"]), ("-3", "晴", "西北风"))
        self.assertNotIn("icon", now)
        self.assertEqual(result["updateTime"], "2025-01-15T10:02+08:00")
        self.assertEqual(result["attribution"], "数据来源：和风天气")
        self.assertTrue(result["fxLink"].startswith("https://www.qweather.com/"))
        self.assertEqual(result["sources"], ["QWeather"])

        lookup, weather = self.qw.requests
        self.assertEqual(lookup.path, "/geo/v2/city/lookup")
        self.assertEqual(lookup.query, {"location": "北京", "number": "1", "lang": "zh"})
        self.assertEqual(weather.path, "/v7/weather/now")
        self.assertEqual(weather.query, {"location": "101010100", "lang": "zh"})
        for request in (lookup, weather):
            self.assertEqual(request.headers["x-qw-api-key"], KEY)
            self.assertIn("gzip", request.headers["accept-encoding"])     # and the answers were gzip
            self.assertNotIn("authorization", request.headers)

        rows = self.sql("SELECT event, exit_code FROM audit_log WHERE skill_name = 'query_weather' ORDER BY id")
        self.assertEqual([r[0] for r in rows], ["skill_started", "skill_finished"])
        self.assertEqual(rows[-1][1], 0)

    async def test_adm_reaches_the_lookup(self):
        result = await self.call("query_weather", {"city": "朝阳", "adm": "辽宁"})
        self.assertIs(result["success"], True, result)
        self.assertEqual((result["city"]["adm1"], result["city"]["id"]), ("辽宁省", "101071201"))
        self.assertEqual(self.qw.requests[0].query["adm"], "辽宁")
        self.assertEqual(self.qw.requests[1].query["location"], "101071201")
        plain = await self.call("query_weather", {"city": "朝阳"})
        self.assertEqual(plain["city"]["adm1"], "北京市")
        self.assertNotIn("adm", self.qw.requests[2].query)

    async def test_city_not_found(self):
        result = await self.call("query_weather", {"city": "不存在市"})
        self.assertEqual(result, {"success": False, "error": result["error"]})
        self.assertIn("未找到城市：不存在市", result["error"])
        self.assertEqual(self.qw.paths(), ["/geo/v2/city/lookup"])
        with_adm = await self.call("query_weather", {"city": "朝阳", "adm": "广东"})
        self.assertIn("未找到城市：朝阳（广东）", with_adm["error"])

    async def test_wrong_key_401(self):
        result = await self.call("query_weather", {"city": "北京"}, QWEATHER_API_KEY="wrong-key")
        self.assertIs(result["success"], False)
        self.assertIn("401", result["error"])
        self.assertIn("QWEATHER_API_KEY", result["error"])
        self.assertNotIn("exit_code", result)          # an expected failure: exit 0, success false

    async def test_rate_limited_429(self):
        self.qw.script("/v7/weather/now", 200, {"code": "429"})
        result = await self.call("query_weather", {"city": "北京"})
        self.assertIs(result["success"], False)
        self.assertIn("429", result["error"])
        self.assertIn("稍后", result["error"])

    async def test_other_codes_are_explained(self):
        cases = [("/v7/weather/now", 200, {"code": "204"}, "204"),
                 ("/v7/weather/now", 200, {"code": "402"}, "402"),
                 ("/geo/v2/city/lookup", 200, {"code": "403"}, "QWEATHER_API_HOST"),
                 ("/geo/v2/city/lookup", 200, {"code": "400"}, "400"),
                 ("/v7/weather/now", 200, {"code": "500"}, "500"),
                 ("/v7/weather/now", 503, {}, "503"),
                 ("/geo/v2/city/lookup", 429, {"error": {"status": 429, "title": "Too Many Requests"}}, "429"),
                 ("/geo/v2/city/lookup", 404, {"error": {"status": 404, "title": "Not Found"}}, "未找到城市")]
        for path, status, body, needle in cases:
            with self.subTest(path=path, status=status, body=body):
                self.qw.script(path, status, body)
                result = await self.call("query_weather", {"city": "北京"})
                self.assertIs(result["success"], False, result)
                self.assertIn(needle, result["error"])
                self.assertNotIn("Traceback", result["error"])

    async def test_missing_key_names_the_variable(self):
        result = await self.call("query_weather", {"city": "北京"}, QWEATHER_API_KEY=None)
        self.assertIs(result["success"], False)
        self.assertIn("QWEATHER_API_KEY", result["error"])
        self.assertEqual(self.qw.requests, [])

    async def test_missing_host_names_the_variable(self):
        result = await self.call("query_weather", {"city": "北京"}, QWEATHER_API_HOST=None)
        self.assertIs(result["success"], False)
        self.assertIn("QWEATHER_API_HOST", result["error"])
        bad = await self.call("query_weather", {"city": "北京"}, QWEATHER_API_HOST="ftp://x.example")
        self.assertIn("QWEATHER_API_HOST", bad["error"])
        self.assertEqual(self.qw.requests, [])

    async def test_malformed_input_is_rejected_before_anything_runs(self):
        for params in ({}, {"city": ""}, {"city": 42}, {"city": "北京", "units": "f"}, {"city": "北京", "adm": 1}):
            with self.subTest(params=params):
                result = await self.call("query_weather", params)
                self.assertIs(result["success"], False)
                self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.qw.requests, [])
        self.assertEqual(self.sql("SELECT count(*) FROM audit_log WHERE event = 'skill_started'"), [(0,)])

    async def test_unreachable_host(self):
        result = await self.call("query_weather", {"city": "北京"},
                                 QWEATHER_API_HOST=f"http://127.0.0.1:{closed_port()}")
        self.assertIs(result["success"], False)
        self.assertIn("无法连接 QWeather", result["error"])

    async def test_the_api_key_reaches_only_the_header(self):
        result = await self.call("query_weather", {"city": "北京"})
        self.assertTrue(result["success"])
        self.assertNotIn(KEY, str(result))
        for request in self.qw.requests:
            self.assertNotIn(KEY, str(request.query))


class NewStyleErrorsTest(WeatherCase):
    server_options = {"auth_style": "http", "not_found": "empty"}

    async def test_http_401_with_error_object(self):
        result = await self.call("query_weather", {"city": "北京"}, QWEATHER_API_KEY="wrong-key")
        self.assertIs(result["success"], False)
        self.assertIn("401", result["error"])
        self.assertIn("QWEATHER_API_KEY", result["error"])

    async def test_empty_location_list_is_not_found(self):
        result = await self.call("query_weather", {"city": "不存在市"})
        self.assertIs(result["success"], False)
        self.assertIn("未找到城市：不存在市", result["error"])
        forecast = await self.call("query_qweather", {"city": "不存在市"})
        self.assertIn("未找到城市：不存在市", forecast["error"])


class QueryQWeatherTest(WeatherCase):
    """The user skill: a 3-day forecast, self-contained beside the system skill."""

    def test_registered_as_a_user_skill(self):
        skill = self.registry.get("query_qweather")
        self.assertEqual((skill.source, skill.risk, skill.overrides), ("user", "low", False))
        self.assertEqual(self.registry.get("query_weather").source, "system")
        self.assertEqual(skill.env, ("QWEATHER_API_HOST", "QWEATHER_API_KEY"))
        self.assertNotIn("query_weather", FORECAST_SCRIPT.read_text())      # no import of the system skill
        self.assertEqual([p for p in self.registry.problems if "weather" in p], [])

    async def test_three_day_forecast(self):
        result = await self.call("query_qweather", {"city": "北京"})
        self.assertIs(result["success"], True, result)
        self.assertEqual(result["city"]["name"], "北京")
        self.assertEqual(len(result["daily"]), 3)
        day = result["daily"][0]
        for field in ("fxDate", "tempMax", "tempMin", "textDay", "textNight"):
            self.assertIn(field, day)
        self.assertEqual(day["fxDate"], "2025-01-15")
        self.assertEqual(result["attribution"], "数据来源：和风天气")
        self.assertIn("fxLink", result)
        self.assertEqual(self.qw.paths(), ["/geo/v2/city/lookup", "/v7/weather/3d"])
        self.assertEqual(self.qw.requests[1].query, {"location": "101010100", "lang": "zh"})
        self.assertIn("gzip", self.qw.requests[1].headers["accept-encoding"])

    async def test_adm_and_explicit_days(self):
        result = await self.call("query_qweather", {"city": "朝阳", "adm": "辽宁", "days": 3})
        self.assertIs(result["success"], True, result)
        self.assertEqual(result["city"]["adm1"], "辽宁省")
        self.assertEqual(self.qw.requests[0].query["adm"], "辽宁")

    async def test_failures(self):
        missing = await self.call("query_qweather", {"city": "北京"}, QWEATHER_API_KEY=None)
        self.assertIn("QWEATHER_API_KEY", missing["error"])
        no_host = await self.call("query_qweather", {"city": "北京"}, QWEATHER_API_HOST="")
        self.assertIn("QWEATHER_API_HOST", no_host["error"])
        self.assertEqual(self.qw.requests, [])
        wrong = await self.call("query_qweather", {"city": "北京"}, QWEATHER_API_KEY="wrong")
        self.assertIn("401", wrong["error"])
        self.qw.script("/v7/weather/3d", 200, {"code": "429"})
        limited = await self.call("query_qweather", {"city": "北京"})
        self.assertIn("429", limited["error"])
        unknown = await self.call("query_qweather", {"city": "不存在市"})
        self.assertIn("未找到城市", unknown["error"])

    async def test_schema(self):
        for params in ({}, {"city": "北京", "days": 7}, {"city": "北京", "days": "3"}, {"city": "北京", "days": True}):
            with self.subTest(params=params):
                result = await self.call("query_qweather", params)
                self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.qw.requests, [])


class ScriptInternalsTest(unittest.TestCase):
    """What a subprocess test cannot reach: the HTTPS default and the request timeout."""

    def test_host_forms(self):
        qweather = load_script(WEATHER_SCRIPT, "skill_weather_now").qweather     # shared by both scripts
        self.assertEqual(qweather.base_url("abc123.def.qweatherapi.com"), "https://abc123.def.qweatherapi.com")
        self.assertEqual(qweather.base_url(" abc.qweatherapi.com/ "), "https://abc.qweatherapi.com")
        self.assertEqual(qweather.base_url("http://127.0.0.1:8080/"), "http://127.0.0.1:8080")
        self.assertEqual(qweather.base_url("https://api.example.com/qw"), "https://api.example.com/qw")
        for bad in ("", None, "   ", "ftp://host", "http://", "two words.com"):
            with self.assertRaises(qweather.SkillError) as caught:
                qweather.base_url(bad)
            self.assertIn("QWEATHER_API_HOST", str(caught.exception))
        for path, name in ((WEATHER_SCRIPT, "skill_weather_now"), (FORECAST_SCRIPT, "skill_forecast")):
            module = load_script(path, name)
            self.assertIs(module.qweather, qweather)
            self.assertLess(module.TIMEOUT, 30 / 2)     # two requests fit in the skill's ## Timeout

    def test_timeout_is_a_clear_error(self):
        module = load_script(WEATHER_SCRIPT, "skill_weather_now_timeout")
        module.TIMEOUT = 0.3
        with QWeatherServer(delay=1.5) as qw:
            with self.assertRaises(module.SkillError) as caught:
                module.main('{"city": "北京"}', {"QWEATHER_API_HOST": qw.base_url, "QWEATHER_API_KEY": KEY})
        self.assertIn("超时", str(caught.exception))


if __name__ == "__main__":
    unittest.main()

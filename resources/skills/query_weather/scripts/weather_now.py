#!/usr/bin/env python3
"""query_weather: current weather for a city from QWeather (和风天气).

Input (stdin, JSON): {"city": "北京", "adm": "北京"}   (adm optional)
Output (stdout): exactly one JSON object with "success".
Environment: QWEATHER_API_HOST (bare host -> https://host, or a full base URL),
             QWEATHER_API_KEY (sent as the X-QW-Api-Key header).

Two requests: GeoAPI city lookup (name -> LocationID), then /v7/weather/now. The QWeather
protocol (gzip, error codes, the lookup) is in ias_skill.qweather, on PYTHONPATH from the
runner. Expected failures (configuration, unknown city, API error codes, network) print
{"success": false, "error": "..."} and exit 0 so the model can relay the message.
"""
from __future__ import annotations

import os

import ias_skill
from ias_skill import SkillError, qweather

TIMEOUT = 10.0                      # seconds per request; the skill's ## Timeout is 30
NOW_FIELDS = ("obsTime", "temp", "feelsLike", "text", "windDir", "windScale", "windSpeed",
              "humidity", "precip", "pressure", "vis", "cloud", "dew")
UNITS = "温度 °C，风速 km/h，湿度 %，降水 mm，气压 hPa，能见度 km"


def main(stdin_text: str, environ=os.environ) -> dict:
    city, adm = qweather.place_params(ias_skill.params(stdin_text))
    api = qweather.Client(environ, TIMEOUT)
    place = api.lookup(city, adm)
    data = api.get("/v7/weather/now", {"location": place["id"], "lang": "zh"})
    now = data.get("now")
    if not isinstance(now, dict):
        raise SkillError("QWeather 实时天气结果缺少 now 字段")
    return qweather.result(place, data, "now", {k: now[k] for k in NOW_FIELDS if k in now}, UNITS)


if __name__ == "__main__":
    ias_skill.run(main, "天气查询失败")

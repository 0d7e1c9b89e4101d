#!/usr/bin/env python3
"""query_qweather: 3-day weather forecast for a city from QWeather (和风天气).

A user skill: no imports from the system skills, only the ias_skill helper shipped with
iAs (on PYTHONPATH from the runner), so the directory can be copied to another iAs as is.

Input (stdin, JSON): {"city": "北京", "days": 3, "adm": "北京"}   (days default 3, adm optional)
Output (stdout): exactly one JSON object with "success".
Environment: QWEATHER_API_HOST (bare host -> https://host, or a full base URL),
             QWEATHER_API_KEY (sent as the X-QW-Api-Key header).

Two requests: GeoAPI city lookup (name -> LocationID), then /v7/weather/3d.
Expected failures print {"success": false, "error": "..."} and exit 0.
"""
from __future__ import annotations

import os

import ias_skill
from ias_skill import SkillError, qweather

TIMEOUT = 10.0                      # seconds per request; the skill's ## Timeout is 30
DAYS = (3,)                         # forecast lengths offered (the free plans have 3d and 7d)
DAILY_FIELDS = ("fxDate", "tempMax", "tempMin", "textDay", "textNight", "windDirDay", "windScaleDay",
                "windDirNight", "windScaleNight", "humidity", "precip", "uvIndex", "sunrise", "sunset")
UNITS = "温度 °C，湿度 %，降水 mm"


def main(stdin_text: str, environ=os.environ) -> dict:
    params = ias_skill.params(stdin_text)
    city, adm = qweather.place_params(params)
    days = params.get("days", 3)
    if isinstance(days, float) and days.is_integer():
        days = int(days)
    if isinstance(days, bool) or days not in DAYS:
        raise SkillError(f"参数 days 只支持 {'、'.join(map(str, DAYS))}")
    api = qweather.Client(environ, TIMEOUT)
    place = api.lookup(city, adm)
    data = api.get(f"/v7/weather/{days}d", {"location": place["id"], "lang": "zh"})
    daily = data.get("daily")
    if not isinstance(daily, list) or not daily:
        raise SkillError("QWeather 天气预报结果缺少 daily 字段")
    days = [{k: day[k] for k in DAILY_FIELDS if k in day} for day in daily if isinstance(day, dict)]
    return qweather.result(place, data, "daily", days, UNITS)


if __name__ == "__main__":
    ias_skill.run(main, "天气预报查询失败")

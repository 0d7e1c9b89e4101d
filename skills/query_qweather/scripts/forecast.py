#!/usr/bin/env python3
"""query_qweather: 3-day weather forecast for a city from QWeather (和风天气).

A user skill: self-contained (no imports from the system skills), so the directory
can be copied to another iAs as is.

Input (stdin, JSON): {"city": "北京", "days": 3, "adm": "北京"}   (days default 3, adm optional)
Output (stdout): exactly one JSON object with "success".
Environment: QWEATHER_API_HOST (bare host -> https://host, or a full base URL),
             QWEATHER_API_KEY (sent as the X-QW-Api-Key header).

Two requests: GeoAPI city lookup (name -> LocationID), then /v7/weather/3d.
QWeather answers gzip-compressed JSON; urllib does not decompress, so this does.
Expected failures (configuration, unknown city, API error codes, network) print
{"success": false, "error": "..."} and exit 0 so the model can relay the message.
Stdlib only, so it runs under the daemon's interpreter ($IAS_PYTHON) without extras.
"""
from __future__ import annotations

import gzip
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 10.0                      # seconds per request; the skill's ## Timeout is 30
USER_AGENT = "iAs-skill/1.0 (query_qweather)"
ATTRIBUTION = "数据来源：和风天气"
DAYS = (3,)                         # forecast lengths offered (the free plans have 3d and 7d)
DAILY_FIELDS = ("fxDate", "tempMax", "tempMin", "textDay", "textNight", "windDirDay", "windScaleDay",
                "windDirNight", "windScaleNight", "humidity", "precip", "uvIndex", "sunrise", "sunset")
UNITS = "温度 °C，湿度 %，降水 mm"

MESSAGES = {
    "204": "QWeather 暂无该地区的数据（204）",
    "400": "QWeather 请求参数错误（400）",
    "401": "QWeather 认证失败（401）：请检查 QWEATHER_API_KEY",
    "402": "QWeather 额度已用完或账户余额不足（402）",
    "403": "QWeather 拒绝访问（403）：请检查 QWEATHER_API_KEY 的权限，以及 QWEATHER_API_HOST 是否为你账户的 API Host",
    "404": "QWeather 未找到该地区的数据（404）",
    "429": "QWeather 请求过于频繁或超出限额（429），请稍后再试",
    "500": "QWeather 服务器错误（500），请稍后再试",
}


class SkillError(Exception):
    """An expected failure; its text is what the model sees."""


def base_url(value: str | None) -> str:
    """QWEATHER_API_HOST as a base URL: a bare host means HTTPS; a full http(s) URL is used as is."""
    value = (value or "").strip()
    if not value:
        raise SkillError("未配置 QWEATHER_API_HOST：请设置为和风天气控制台中你的 API Host（如 abc123.def.qweatherapi.com）")
    if "://" not in value:
        value = "https://" + value.strip("/")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise SkillError(f"QWEATHER_API_HOST 无效：{value!r}（应为主机名，或 http(s):// 开头的地址）")
    return value.rstrip("/")


def _decode(raw: bytes, headers) -> object:
    encoding = (headers.get("Content-Encoding") or "").lower() if headers is not None else ""
    if "gzip" in encoding or raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise SkillError(f"QWeather 返回的数据无法解压：{exc}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        return None


def get(base: str, path: str, query: dict, key: str) -> tuple[int, object]:
    """GET base+path?query; returns (HTTP status, parsed JSON or None). Network problems raise SkillError."""
    url = f"{base}{path}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={
        "X-QW-Api-Key": key, "Accept-Encoding": "gzip", "Accept": "application/json", "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, _decode(response.read(), response.headers)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        return exc.code, _decode(raw, exc.headers)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SkillError(f"QWeather 请求超时（{TIMEOUT:g} 秒），请稍后再试") from None
        raise SkillError(f"无法连接 QWeather（{urllib.parse.urlsplit(base).netloc}）：{exc.reason}") from None
    except TimeoutError:
        raise SkillError(f"QWeather 请求超时（{TIMEOUT:g} 秒），请稍后再试") from None
    except (OSError, http.client.HTTPException) as exc:
        raise SkillError(f"QWeather 网络错误：{type(exc).__name__}: {exc}") from None


def failure_code(status: int, data: object) -> tuple[str | None, str]:
    """(error code, detail) of a QWeather answer; code None = success.

    Two error styles exist: the v7 body `{"code": "401"}` (HTTP 200) and the newer HTTP
    status with `{"error": {"status", "title", "detail"}}`.
    """
    body = data if isinstance(data, dict) else {}
    code = body.get("code")
    detail = ""
    error = body.get("error")
    if isinstance(error, dict):
        detail = str(error.get("detail") or error.get("title") or "")
        code = code or error.get("status")
    if status != 200:
        return str(code or status), detail
    if code is None:
        return "invalid", "响应中没有 code"
    return (None, "") if str(code) == "200" else (str(code), detail)


def error_text(code: str, detail: str) -> str:
    if code in MESSAGES:
        text = MESSAGES[code]
    elif code == "invalid":
        text = "QWeather 返回了无法识别的响应"
    elif code.isdigit() and int(code) >= 500:
        text = f"QWeather 服务暂时不可用（{code}），请稍后再试"
    else:
        text = f"QWeather 返回错误（{code}）"
    return f"{text}：{detail}" if detail and code not in ("401", "429") else text


def lookup(base: str, key: str, city: str, adm: str | None) -> dict:
    query = {"location": city, "number": 1, "lang": "zh"}
    if adm:
        query["adm"] = adm
    status, data = get(base, "/geo/v2/city/lookup", query, key)
    code, detail = failure_code(status, data)
    where = f"{city}（{adm}）" if adm else city
    if code == "404" or (code is None and not data.get("location")):
        raise SkillError(f"未找到城市：{where}。请检查名称，或用 adm 指定所属省份/城市")
    if code is not None:
        raise SkillError(error_text(code, detail))
    place = data["location"][0]
    if not isinstance(place, dict) or not place.get("id"):
        raise SkillError("QWeather 城市查询结果缺少 LocationID")
    return place


def read_params(text: str) -> tuple[str, int, str | None]:
    try:
        params = json.loads(text or "{}")
    except ValueError:
        raise SkillError("参数不是有效的 JSON") from None
    if not isinstance(params, dict):
        raise SkillError("参数必须是 JSON 对象")
    city = params.get("city")
    if not isinstance(city, str) or not city.strip():
        raise SkillError("缺少参数 city（城市名）")
    days = params.get("days", 3)
    if isinstance(days, float) and days.is_integer():
        days = int(days)
    if isinstance(days, bool) or days not in DAYS:
        raise SkillError(f"参数 days 只支持 {'、'.join(map(str, DAYS))}")
    adm = params.get("adm")
    if adm is not None and not isinstance(adm, str):
        raise SkillError("参数 adm 必须是字符串")
    return city.strip(), days, (adm or "").strip() or None


def main(stdin_text: str, environ=os.environ) -> dict:
    city, days, adm = read_params(stdin_text)
    key = (environ.get("QWEATHER_API_KEY") or "").strip()
    if not key:
        raise SkillError("未配置 QWEATHER_API_KEY：请在环境变量中设置和风天气 API Key")
    base = base_url(environ.get("QWEATHER_API_HOST"))

    place = lookup(base, key, city, adm)
    status, data = get(base, f"/v7/weather/{days}d", {"location": place["id"], "lang": "zh"}, key)
    code, detail = failure_code(status, data)
    if code is not None:
        raise SkillError(error_text(code, detail))
    daily = data.get("daily")
    if not isinstance(daily, list) or not daily:
        raise SkillError("QWeather 天气预报结果缺少 daily 字段")

    result = {
        "success": True,
        "city": {k: place.get(k, "") for k in ("name", "adm1", "adm2", "country", "id")},
        "daily": [{k: day[k] for k in DAILY_FIELDS if k in day} for day in daily if isinstance(day, dict)],
        "units": UNITS,
        "updateTime": data.get("updateTime", ""),
        "attribution": ATTRIBUTION,
    }
    if data.get("fxLink"):
        result["fxLink"] = data["fxLink"]
    refer = data.get("refer")
    if isinstance(refer, dict) and refer.get("sources"):
        result["sources"] = refer["sources"]
    return result


def run() -> None:
    try:
        result = main(sys.stdin.read())
    except SkillError as exc:
        result = {"success": False, "error": str(exc)}
    except Exception as exc:        # never a traceback: the model gets one line
        result = {"success": False, "error": f"天气预报查询失败：{type(exc).__name__}: {exc}"}
    sys.stdout.buffer.write(json.dumps(result, ensure_ascii=False).encode("utf-8") + b"\n")


if __name__ == "__main__":
    run()

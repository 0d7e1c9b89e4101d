"""QWeather (和风天气) for skill scripts: configuration, error texts, the city lookup and the result.

Shared by the system skill query_weather and the user skill query_qweather; each script keeps
its own endpoint, fields and parameters. QWEATHER_API_HOST is a bare host (HTTPS) or a full
base URL; QWEATHER_API_KEY goes in the X-QW-Api-Key header (and nowhere else).
Two error styles exist: the v7 body `{"code": "401"}` (HTTP 200) and the newer HTTP status
with `{"error": {"status", "title", "detail"}}`; both become one clear sentence.
"""
from __future__ import annotations

import ias_skill
from ias_skill import SkillError

SERVICE = "QWeather"
ATTRIBUTION = "数据来源：和风天气"
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


def base_url(value: str | None) -> str:
    """QWEATHER_API_HOST as a base URL: a bare host means HTTPS; a full http(s) URL is used as is."""
    return ias_skill.base_url(value, "QWEATHER_API_HOST",
                              hint="请设置为和风天气控制台中你的 API Host（如 abc123.def.qweatherapi.com）")


def place_params(params: dict) -> tuple[str, str | None]:
    """The `city` (required) and `adm` (optional) parameters, stripped."""
    city = params.get("city")
    if not isinstance(city, str) or not city.strip():
        raise SkillError("缺少参数 city（城市名）")
    adm = params.get("adm")
    if adm is not None and not isinstance(adm, str):
        raise SkillError("参数 adm 必须是字符串")
    return city.strip(), (adm or "").strip() or None


def failure_code(status: int, data: object) -> tuple[str | None, str]:
    """(error code, detail) of a QWeather answer; code None = success."""
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


class Client:
    """One skill run's QWeather: the key and base URL from the environment, and a request timeout."""

    def __init__(self, environ, timeout: float):
        self.key = ias_skill.require("QWEATHER_API_KEY", "请在环境变量中设置和风天气 API Key", environ)
        self.base = base_url(environ.get("QWEATHER_API_HOST"))
        self.timeout = timeout

    def fetch(self, path: str, query: dict) -> tuple[int, object]:
        """(HTTP status, parsed JSON or None) of GET base+path?query."""
        return ias_skill.request_json(f"{self.base}{path}", query=query, headers={"X-QW-Api-Key": self.key},
                                      timeout=self.timeout, service=SERVICE)

    def get(self, path: str, query: dict) -> dict:
        """The answer of a successful GET; an error answer raises SkillError with a clear text."""
        status, data = self.fetch(path, query)
        code, detail = failure_code(status, data)
        if code is not None:
            raise SkillError(error_text(code, detail))
        return data

    def lookup(self, city: str, adm: str | None) -> dict:
        """The best GeoAPI match for the city (with its LocationID `id`)."""
        query = {"location": city, "number": 1, "lang": "zh"}
        if adm:
            query["adm"] = adm
        status, data = self.fetch("/geo/v2/city/lookup", query)
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


def result(place: dict, data: dict, key: str, value: object, units: str) -> dict:
    """The skill's result: the place, `key: value` (the script's own part), units and attribution."""
    answer = {
        "success": True,
        "city": {k: place.get(k, "") for k in ("name", "adm1", "adm2", "country", "id")},
        key: value,
        "units": units,
        "updateTime": data.get("updateTime", ""),
        "attribution": ATTRIBUTION,
    }
    if data.get("fxLink"):
        answer["fxLink"] = data["fxLink"]
    refer = data.get("refer")
    if isinstance(refer, dict) and refer.get("sources"):
        answer["sources"] = refer["sources"]
    return answer

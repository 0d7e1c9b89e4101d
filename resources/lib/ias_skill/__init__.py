"""ias_skill: what iAs's Python skill scripts share — JSON in and out, HTTP, error results.

The runner puts `resources/lib` on every skill's PYTHONPATH, so a script run as
`"$IAS_PYTHON" scripts/x.py` can `import ias_skill`; a skill may use it or not. Stdlib only.

A script's job: `params(text)` for the parameters JSON on stdin, `SkillError` for an
expected failure (its text is what the model sees), `run(main, label)` to print exactly one
result object and never a traceback, `request_json()` for an HTTP call. Service clients
used by more than one shipped skill live beside it (`ias_skill.qweather`, `ias_skill.tavily`).

Deliberately not handled: retries, cookies, streaming responses, a deadline across several
requests (the runner's `## Timeout` ends the whole run), decodings other than gzip.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.parse
import zlib

VERSION = "1.0"
RESPONSE_MAX = 4 * 1024 * 1024      # bytes of one HTTP response body, as sent and after gunzip
OUTPUT_MAX = 64 * 1024 - 512        # bytes of stdout: the runner shows the model 64 KiB; a margin


class SkillError(Exception):
    """An expected failure: its text, with any extra result fields, is what the model sees."""

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.fields = fields

    def result(self) -> dict:
        return {"success": False, "error": str(self), **self.fields}


# ---------------------------------------------------------------------------------------
# JSON in and out


def params(text: str | bytes) -> dict:
    """The parameters JSON object from stdin's text (empty text = no parameters)."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        raise SkillError("参数不是有效的 JSON") from None
    if not isinstance(value, dict):
        raise SkillError("参数必须是 JSON 对象")
    return value


def encoded(result: dict) -> bytes:
    """One line of JSON as the model reads it; "replace": a lone surrogate cannot break it."""
    return json.dumps(result, ensure_ascii=False).encode("utf-8", "replace") + b"\n"


def fit_text(result: dict, key: str, flag: str | None = None) -> dict:
    """Cut result[key] (a string) so the whole result fits OUTPUT_MAX bytes; set result[flag] if cut."""
    if len(encoded(result)) <= OUTPUT_MAX:
        return result
    text = result[key]
    if flag:
        result[flag] = True
    low, high = 0, len(text)        # the longest prefix that fits
    while low < high:
        middle = (low + high + 1) // 2
        result[key] = text[:middle]
        if len(encoded(result)) <= OUTPUT_MAX:
            low = middle
        else:
            high = middle - 1
    result[key] = text[:low]
    return result


def emit(result: dict) -> None:
    """Print the result; one too large for the model is never cut into invalid JSON."""
    data = encoded(result)
    if len(data) > OUTPUT_MAX:
        if isinstance(result.get("error"), str):
            data = encoded(fit_text(result, "error"))
        if len(data) > OUTPUT_MAX:
            data = encoded({"success": False, "error": "the result was too large to return"})
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def run(main, label: str) -> None:
    """Print main(stdin text)'s result; a SkillError or any other exception becomes an error result."""
    try:
        result = main(sys.stdin.read())
    except SkillError as exc:
        result = exc.result()
    except Exception as exc:        # never a traceback: the model gets one line
        result = {"success": False, "error": f"{label}：{type(exc).__name__}: {exc}"}
    emit(result)


# ---------------------------------------------------------------------------------------
# Configuration


def env(name: str, environ=None) -> str:
    """An environment variable, stripped; "" when unset."""
    return ((os.environ if environ is None else environ).get(name) or "").strip()


def require(name: str, hint: str, environ=None) -> str:
    """An environment variable that must be set; unset or blank is an error naming it."""
    value = env(name, environ)
    if not value:
        raise SkillError(f"未配置 {name}：{hint}")
    return value


def base_url(value: str | None, name: str, default: str = "", hint: str = "") -> str:
    """A service's base URL from variable `name`: a bare host means HTTPS; no trailing slash."""
    value = (value or "").strip() or default
    if not value:
        raise SkillError(f"未配置 {name}：{hint}")
    if "://" not in value:
        value = "https://" + value.strip("/")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise SkillError(f"{name} 无效：{value!r}（应为主机名，或 http(s):// 开头的地址）")
    return value.rstrip("/")


# ---------------------------------------------------------------------------------------
# HTTP


def request_json(url: str, *, service: str, timeout: float, query: dict | None = None, body: object = None,
                 headers: dict | None = None, limit: int = RESPONSE_MAX) -> tuple[int, object]:
    """GET url?query, or POST `body` as JSON; (HTTP status, parsed JSON or None).

    An HTTP error status is returned, not raised; no answer (refused, timed out, broken) and
    a body over `limit` bytes raise SkillError naming `service`. Every request asks for gzip.
    `headers` (the caller's: keys, tokens) follow a redirect only within the same scheme, host
    and port; a redirect elsewhere is followed without them.
    """
    # Imported here: a script that makes no request (execute_shell) starts ~30 ms sooner.
    import http.client
    import urllib.error
    import urllib.request

    if query:
        url = f"{url}?{urllib.parse.urlencode(query)}"
    head = {"Accept": "application/json", "Accept-Encoding": "gzip",
            "User-Agent": f"iAs-skill/{VERSION} ({os.environ.get('IAS_SKILL') or 'skill'})"}
    data = None
    if body is not None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        head["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                     headers={**head, **(headers or {})})
    opener = urllib.request.build_opener(_redirect_handler({name.lower() for name in headers or ()}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, _decode(response.read(limit + 1), response.headers, service, limit)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read(limit + 1)
        except (OSError, http.client.HTTPException):
            raw = b""
        return exc.code, _decode(raw, exc.headers, service, limit)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SkillError(f"{service} 请求超时（{timeout:g} 秒），请稍后再试") from None
        raise SkillError(f"无法连接 {service}（{urllib.parse.urlsplit(url).netloc}）：{exc.reason}") from None
    except TimeoutError:
        raise SkillError(f"{service} 请求超时（{timeout:g} 秒），请稍后再试") from None
    except (OSError, http.client.HTTPException) as exc:
        raise SkillError(f"{service} 网络错误：{type(exc).__name__}: {exc}") from None


def origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of a URL, the port filled in for http/https; None when it has no valid one."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    return (parts.scheme.lower(), (parts.hostname or "").lower(), port) if parts.hostname else None


def _redirect_handler(private: set[str]):
    """A redirect handler that drops the caller's headers (`private`, lower-case names: API keys,
    Authorization …) when a redirect leaves the origin, so a key never reaches another host.

    urllib's own handler copies every header to wherever the Location points.
    """
    import urllib.request

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and private and (origin(new.full_url) is None
                                                or origin(new.full_url) != origin(req.full_url)):
                new.headers = {k: v for k, v in new.headers.items() if k.lower() not in private}
            return new
    return Redirects()


def _decode(raw: bytes, headers, service: str, limit: int) -> object:
    """The body as JSON (None when it is not JSON), gunzipped when it is gzip; at most `limit` bytes."""
    too_large = SkillError(f"{service} 返回的数据过大（超过 {limit} 字节）")
    if len(raw) > limit:
        raise too_large
    encoding = (headers.get("Content-Encoding") or "").lower() if headers is not None else ""
    if "gzip" in encoding or raw[:2] == b"\x1f\x8b":
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            plain = inflate.decompress(raw, limit + 1)
        except zlib.error as exc:
            raise SkillError(f"{service} 返回的数据无法解压：{exc}") from None
        if len(plain) > limit or inflate.unconsumed_tail:
            raise too_large
        if not inflate.eof:
            raise SkillError(f"{service} 返回的数据无法解压：数据不完整")
        raw = plain
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------
# Processes


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def group_alive(pgid: int) -> bool:
    """Whether a non-zombie process of the group is left (zombies no init reaps do not count)."""
    if not signal_group(pgid, 0):
        return False
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return True
    for name in names:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False

"""The iLink bot protocol over HTTP: the client, the protocol constants, the credentials and the login state.

Protocol facts are in reference/wechat-ilink.md. Who uses it: the WeChat channel
(`channel.py`: polling, sending, the send budget) and the QR login
(`login.py`). The `channel_state` keys of channel "wechat" are listed here because both
of them (and the owner lookup in `ias.app`) read what the other wrote.

The client is a minimal asyncio HTTP/1.1 client, one connection per request (`Connection: close`),
so that cancelling a task ends a held 35-second long poll at once; urllib in a thread could not be.
Every response is bounded (WECHAT_HEADERS_MAX header lines, WECHAT_RESPONSE_MAX body bytes, and the
caller's timeout for the whole exchange); a malformed one is a WeChatError.

Deliberately not handled: HTTP proxies, keep-alive connections, redirects, compressed bodies
(`Accept-Encoding: identity` is sent), the optional endpoints (`getconfig`, `sendtyping`). The CDN, whose
transfers are larger than WECHAT_RESPONSE_MAX and carry no iLink headers, has its own client (`cdn.py`).
"""
from __future__ import annotations

import asyncio
import base64
import json
import secrets
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ... import limits, version
from ...errors import IasError

DEFAULT_BASE_URL = "https://ilinkai.weixin.qq.com"
PROTOCOL_VERSION = "2.4.3"          # the openclaw-weixin release whose wire format we follow
APP_ID = "bot"
STALE = -14                         # session timeout, or the bot was bound by another client
USER_MESSAGE, BOT_MESSAGE = 1, 2
FINISHED = 2                        # message_state of a complete (not streaming) message
TEXT, IMAGE, VOICE, FILE, VIDEO = 1, 2, 3, 4, 5

GET_UPDATES = "ilink/bot/getupdates"
SEND_MESSAGE = "ilink/bot/sendmessage"
GET_QRCODE = "ilink/bot/get_bot_qrcode?bot_type=3"
QRCODE_STATUS = "ilink/bot/get_qrcode_status"

# channel_state keys (channel "wechat")
CHANNEL = "wechat"
TOKEN, BASE_URL, BOT_ID, OWNER, CURSOR, STALE_MARK = "token", "base_url", "bot_id", "owner", "cursor", "stale"
PEER = "peer:"                      # + user id: {"context_token", "last_inbound", "sent"}


class WeChatError(IasError):
    """The iLink service failed, answered nonsense, or a login could not complete."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the channel needs to act as the bot; the token is kept out of repr."""
    token: str = field(repr=False)
    base_url: str
    bot_id: str | None
    owner: str


@dataclass(frozen=True, slots=True)
class LoginState:
    """The stored login as `ias wechat status` and doctor show it: never the token, only whether there is one."""
    logged_in: bool
    base_url: str | None
    bot_id: str | None
    owner: str | None
    cursor: bool                    # a getupdates cursor is stored
    last_inbound: str | None        # the owner's last message, ISO 8601 local time
    stale: bool                     # the session expired (-14) and nothing was received since
    stale_since: str | None


def client_version(version: str = PROTOCOL_VERSION) -> str:
    """iLink-App-ClientVersion: (major << 16) | (minor << 8) | patch, as decimal."""
    major, minor, patch = (int(part) for part in version.split("."))
    return str((major & 0xFF) << 16 | (minor & 0xFF) << 8 | (patch & 0xFF))


def error_code(reply: dict) -> int:
    """The first non-zero `ret`/`errcode` of a reply, else 0."""
    for key in ("ret", "errcode"):
        value = reply.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value != 0:
            return value
    return 0


class ILink:
    """The iLink HTTP API at one base URL: with a token for the bot's calls, without for the QR login."""

    def __init__(self, base_url: str, token: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._agent = f"iAs/{version()}"
        self._tls: ssl.SSLContext | None = None

    def _common(self) -> dict[str, str]:
        return {"iLink-App-Id": APP_ID, "iLink-App-ClientVersion": client_version()}

    async def call(self, endpoint: str, body: dict, timeout: float) -> dict:
        """POST an authenticated call (headers and base_info added); the decoded reply."""
        if not self._token:
            raise WeChatError("not logged in to WeChat")
        uin = base64.b64encode(str(secrets.randbits(32)).encode()).decode()
        headers = {"Content-Type": "application/json", "AuthorizationType": "ilink_bot_token",
                   "Authorization": f"Bearer {self._token}", "X-WECHAT-UIN": uin, **self._common()}
        payload = {**body, "base_info": {"channel_version": PROTOCOL_VERSION, "bot_agent": self._agent}}
        return await self._json("POST", endpoint, headers, payload, timeout)

    async def post(self, endpoint: str, body: dict, timeout: float) -> dict:
        """POST without a token (QR login)."""
        return await self._json("POST", endpoint, {"Content-Type": "application/json", **self._common()}, body, timeout)

    async def get(self, endpoint: str, timeout: float) -> dict:
        """GET without a token (QR status)."""
        return await self._json("GET", endpoint, self._common(), None, timeout)

    async def _json(self, method: str, endpoint: str, headers: dict[str, str], body: dict | None,
                    timeout: float) -> dict:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        async with asyncio.timeout(timeout):
            status, raw = await self._exchange(method, f"{self.base_url}/{endpoint}", headers, data)
        if not 200 <= status < 300:
            raise WeChatError(f"HTTP {status} from {endpoint.partition('?')[0]}")
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):        # RecursionError: nested too deeply to decode
            raise WeChatError(f"{endpoint.partition('?')[0]} did not answer JSON") from None
        if not isinstance(reply, dict):
            raise WeChatError(f"{endpoint.partition('?')[0]} did not answer a JSON object")
        return reply

    async def _exchange(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        """One HTTP/1.1 request on a fresh connection: (status, body). Raises OSError or WeChatError."""
        try:
            parts = urlsplit(url)
            port = parts.port       # a stored or redirected base URL may carry a port that is no number
        except ValueError:
            raise WeChatError("not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WeChatError(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        tls = None
        if parts.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        lines = [f"{method} {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                 f"Host: {parts.netloc.rpartition('@')[2]}", "Connection: close", "Accept-Encoding: identity"]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise WeChatError(f"invalid characters in the {name} header")
            lines.append(f"{name}: {value}")
        try:
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError:
            raise WeChatError("a header value is not ASCII") from None
        reader, writer = await asyncio.open_connection(parts.hostname, port or (443 if tls else 80), ssl=tls)
        try:
            writer.write(head + (body or b""))
            await writer.drain()
            return await _response(reader, method)
        except (ValueError, IndexError, EOFError) as exc:     # malformed or truncated response
            raise WeChatError(f"bad HTTP response: {type(exc).__name__}") from None
        finally:
            writer.close()


async def _response(reader: asyncio.StreamReader, method: str) -> tuple[int, bytes]:
    while True:
        status_line = await reader.readline()
        if not status_line:
            raise WeChatError("connection closed before a response")
        status = int(status_line.split(None, 2)[1])
        headers: dict[str, str] = {}
        for _ in range(limits.WECHAT_HEADERS_MAX):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise WeChatError("too many response headers")
        if status >= 200 or status < 100:
            break
    if method == "HEAD" or status in (204, 304):
        return status, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, await _chunked(reader)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if not 0 <= length <= limits.WECHAT_RESPONSE_MAX:
            raise WeChatError(f"response of {length} bytes refused")
        return status, await reader.readexactly(length)
    chunks, size = [], 0
    while chunk := await reader.read(64 * 1024):
        size += len(chunk)
        if size > limits.WECHAT_RESPONSE_MAX:
            raise WeChatError("response too large")
        chunks.append(chunk)
    return status, b"".join(chunks)


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    chunks, size = [], 0
    while True:
        length = int((await reader.readline()).split(b";")[0].strip(), 16)
        if length == 0:
            for _ in range(limits.WECHAT_HEADERS_MAX):       # trailers, up to the blank line
                if (await reader.readline()) in (b"\r\n", b"\n", b""):
                    return b"".join(chunks)
            raise WeChatError("too many trailer lines")
        size += length
        if size > limits.WECHAT_RESPONSE_MAX:
            raise WeChatError("response too large")
        chunks.append(await reader.readexactly(length))
        await reader.readline()

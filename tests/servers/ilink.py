"""A local iLink bot server (Tencent's WeChat "ClawBot" protocol), written from reference/wechat-ilink.md.

- QR login: `get_bot_qrcode` hands out a new id each time; `get_qrcode_status` answers the
  scripted steps in `login` one per poll (default: `wait`, held for `hold` seconds). A
  `need_verifycode` step (with `code`) repeats until a poll carries that `verify_code` (after
  `attempts` wrong codes it turns into `verify_code_blocked`); a
  `confirmed` step is completed with this server's token, bot id, base URL and owner; a step
  may carry `hold` (seconds before answering). A poll for anything but the newest QR id
  handed out is a protocol problem.
- `getupdates` takes the next scripted reply from `updates` if any (`{"http": 500}` for an
  HTTP error), else holds the request until the message log grows past the caller's cursor
  (`buf-<n>`) or `hold` passes. With `stale` set every authenticated call answers -14.
- `sendmessage` records each `msg` in `sent` and answers the next of `send_replies`, else ret 0; a
  reply with `hold` is answered that many seconds after the message was recorded (a slow service).
- `raw`: while it holds byte strings, the next request of any kind is answered with the first of
  them, written verbatim, and the connection closed (for malformed or oversized responses).

- The CDN (reference/wechat-ilink-media.md) under `cdn_url` (`<base_url>/c2c`): `GET /download?
  encrypted_query_param=P` and `GET /full/P` (a `full_url`) serve `files[P]`, ciphertext the test made
  (`cdn_replies`: scripted failures first, `{"http": 500}`); `getuploadurl` records its body in
  `upload_requests` and answers an `upload_full_url` (or an `upload_param` when `upload_full` is off),
  or the next of `upload_replies`; `POST /upload` records the ciphertext in `uploads` and answers the
  `x-encrypted-param` header `dl-N`, whose ciphertext is then in `files` too. `sendmessage` takes one
  text, image (type 2) or file (type 4) item in the shapes of the protocol notes.

Authenticated calls are checked for the required headers and `base_info`; a bad one is
answered with an error and listed in `problems`, which tests expect to stay empty. Every
request is recorded in `requests`.
"""
from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs

from tests.servers import JSONHandler, JSONServer

AUTHENTICATED = ("/ilink/bot/getupdates", "/ilink/bot/sendmessage", "/ilink/bot/getuploadurl")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict
    headers: dict
    body: object
    at: float


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address):
        pass                    # a client that went away mid-hold (stop(), timeouts) is expected


class ILinkServer(JSONServer):
    """Start with `with ILinkServer() as server:` (or start()/close()); `base_url` is the API root."""
    server_class = _HTTPServer

    def __init__(self, hold: float = 1.0, token: str = "bot-token-1", owner: str = "o9cq-owner@im.wechat",
                 bot_id: str = "b0f5-bot@im.bot"):
        self.hold = hold
        self.token = token
        self.owner = owner
        self.bot_id = bot_id
        self.requests: list[Request] = []
        self.problems: list[str] = []
        self.login: list[dict] = []
        self.qrcodes: list[str] = []
        self.updates: list[dict] = []
        self.log: list[dict] = []
        self.send_replies: list[dict] = []
        self.sent: list[dict] = []
        self.stale = False
        self.raw: list[bytes] = []
        self.files: dict[str, bytes] = {}
        self.cdn_replies: list[dict] = []
        self.upload_requests: list[dict] = []
        self.upload_replies: list[dict] = []
        self.uploads: list[dict] = []
        self.upload_full = True
        self._ids = itertools.count(7_000_000_000_000_000_001)
        self._cond = threading.Condition()
        self._closing = False
        server = self

        class Handler(JSONHandler):
            def _handle(self, method: str) -> None:
                path, _, query = self.path.partition("?")
                raw = self.read_body()
                self.read_body_raw = raw
                try:
                    body = None if not raw or path.startswith("/c2c/") else json.loads(raw)
                except ValueError:
                    body = raw
                headers = self.lowered_headers()
                params = {k: v[0] for k, v in parse_qs(query).items()}
                with server._cond:
                    server.requests.append(Request(method, path, params, headers, body, time.monotonic()))
                    raw = server.raw.pop(0) if server.raw else None
                if raw is not None:
                    self.close_connection = True
                    self.wfile.write(raw)
                    return
                if path.startswith("/c2c/"):
                    status, data, extra = server._cdn(method, path, params, self.read_body_raw)
                    self.send_response(status)
                    for name, value in {"Content-Type": "application/octet-stream", **extra}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_json(*server._route(method, path, params, headers, body))

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.listen(Handler)

    # -- scripting --------------------------------------------------------------------------
    def message(self, text: str | None = "你好", *, sender: str | None = None, items: list | None = None,
                message_type: int = 1, context_token: str | None = None, message_id: int | None = None) -> dict:
        """Queue an inbound message (text by default) and wake a held getupdates."""
        with self._cond:
            mid = message_id if message_id is not None else next(self._ids)
            msg = {"seq": len(self.log) + 1, "message_id": mid, "from_user_id": sender or self.owner,
                   "to_user_id": self.bot_id, "create_time_ms": int(time.time() * 1000),
                   "message_type": message_type, "message_state": 2,
                   "context_token": context_token or f"ctx-{mid}",
                   "item_list": items if items is not None else [{"type": 1, "text_item": {"text": text}}]}
            self.log.append(msg)
            self._cond.notify_all()
        return msg

    def redeliver(self, msg: dict) -> None:
        """Queue an already delivered message again (the service does that after reconnects)."""
        with self._cond:
            self.log.append(dict(msg))
            self._cond.notify_all()

    def calls(self, path: str) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.path == path]

    # -- protocol ---------------------------------------------------------------------------
    def _problem(self, text: str) -> dict:
        with self._cond:
            self.problems.append(text)
        return {"ret": -1, "errcode": -1, "errmsg": text}

    def _route(self, method: str, path: str, params: dict, headers: dict, body) -> tuple[int, dict]:
        if path == "/ilink/bot/get_bot_qrcode" and method == "POST":
            return 200, self._qrcode(params, body)
        if path == "/ilink/bot/get_qrcode_status" and method == "GET":
            return 200, self._qr_status(params)
        if path in AUTHENTICATED and method == "POST":
            problem = self._check(headers, body)
            if problem:
                return 200, self._problem(f"{path}: {problem}")
            if self.stale:
                return 200, {"ret": -14, "errcode": -14, "errmsg": "session timeout"}
            if path.endswith("getupdates"):
                return self._getupdates(body)
            if path.endswith("getuploadurl"):
                return 200, self._getuploadurl(body)
            return 200, self._sendmessage(body)
        return 404, {"ret": -1, "errmsg": f"no such endpoint: {method} {path}"}

    def _check(self, headers: dict, body) -> str | None:
        expected = {"content-type": "application/json", "authorizationtype": "ilink_bot_token",
                    "authorization": f"Bearer {self.token}", "ilink-app-id": "bot",
                    "ilink-app-clientversion": "132099"}
        for name, value in expected.items():
            if headers.get(name) != value:
                return f"header {name} is {headers.get(name)!r}"
        try:
            uin = int(base64.b64decode(headers.get("x-wechat-uin", ""), validate=True).decode())
        except ValueError:
            return "X-WECHAT-UIN is not base64 of a decimal number"
        if not 0 <= uin < 2 ** 32:
            return "X-WECHAT-UIN is not a uint32"
        info = body.get("base_info") if isinstance(body, dict) else None
        if not isinstance(info, dict) or info.get("channel_version") != "2.4.3" \
                or not str(info.get("bot_agent", "")).startswith("iAs/"):
            return f"base_info is {info!r}"
        return None

    def _qrcode(self, params: dict, body) -> dict:
        if params.get("bot_type") != "3" or body != {"local_token_list": []}:
            return self._problem(f"get_bot_qrcode with {params} {body!r}")
        with self._cond:
            qrcode = f"qr-{len(self.qrcodes) + 1}-{next(self._ids) % 100000}"
            self.qrcodes.append(qrcode)
        return {"ret": 0, "qrcode": qrcode,
                "qrcode_img_content": f"https://liteapp.weixin.qq.com/q/7GiQu1?qrcode={qrcode}&bot_type=3"}

    def _qr_status(self, params: dict) -> dict:
        with self._cond:
            if self.qrcodes and params.get("qrcode") != self.qrcodes[-1]:
                self.problems.append(f"status poll for {params.get('qrcode')!r}, not the newest QR code")
            step = self.login[0] if self.login else {"status": "wait", "hold": self.hold}
            code = params.get("verify_code")
            if step["status"] == "need_verifycode" and code == step["code"]:
                self.login.pop(0)
                step = self.login.pop(0) if self.login else {"status": "wait"}
            elif step["status"] == "need_verifycode" and code:
                step["wrong"] = step.get("wrong", 0) + 1
                if step["wrong"] >= step.get("attempts", 1 << 30):
                    self.login.pop(0)
                    step = {"status": "verify_code_blocked"}
            elif step["status"] != "need_verifycode" and self.login:
                self.login.pop(0)
        if step.get("hold"):
            self._wait(step["hold"])
        reply = {k: v for k, v in step.items() if k not in ("hold", "code", "attempts", "wrong")}
        if reply["status"] == "confirmed":
            defaults = {"bot_token": self.token, "ilink_bot_id": self.bot_id, "baseurl": self.base_url,
                        "ilink_user_id": self.owner}
            reply = {k: v for k, v in {**defaults, **reply}.items() if v is not None}
        return {"ret": 0, **reply}

    def _wait(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._closing, timeout=seconds)

    def _getupdates(self, body: dict) -> tuple[int, dict]:
        with self._cond:
            step = self.updates.pop(0) if self.updates else None
        if step is not None:
            return (step["http"], {"ret": -1, "errmsg": "scripted HTTP error"}) if "http" in step else (200, step)
        cursor = body.get("get_updates_buf") or ""
        if cursor and not cursor.startswith("buf-"):
            return 200, self._problem(f"unknown cursor {cursor!r}")
        start = int(cursor[4:]) if cursor else 0
        with self._cond:
            self._cond.wait_for(lambda: len(self.log) > start or self._closing or self.stale, timeout=self.hold)
            if self.stale:
                return 200, {"ret": -14, "errcode": -14, "errmsg": "session timeout"}
            return 200, {"ret": 0, "msgs": self.log[start:], "get_updates_buf": f"buf-{len(self.log)}",
                         "longpolling_timeout_ms": int(self.hold * 1000)}

    @property
    def cdn_url(self) -> str:
        return f"{self.base_url}/c2c"

    def full_url(self, param: str) -> str:
        return f"{self.cdn_url}/full/{param}"

    def _cdn(self, method: str, path: str, params: dict, body: bytes) -> tuple[int, bytes, dict]:
        with self._cond:
            step = self.cdn_replies.pop(0) if self.cdn_replies else None
        if step is not None:
            return step["http"], step.get("body", b""), step.get("headers", {})
        if method == "GET" and (path == "/c2c/download" or path.startswith("/c2c/full/")):
            param = params.get("encrypted_query_param") if path == "/c2c/download" else path[len("/c2c/full/"):]
            data = self.files.get(param or "")
            return (200, data, {}) if data is not None else (404, b"no such file", {})
        if method == "POST" and path == "/c2c/upload":
            with self._cond:
                asked = [r for r in self.upload_requests if r.get("upload_param") == params.get("encrypted_query_param")]
                if not asked or asked[-1]["filekey"] != params.get("filekey"):
                    self.problems.append(f"upload to an unknown URL: {params}")
                    return 400, b"", {"x-error-message": "unknown upload"}
                reference = f"dl-{len(self.uploads) + 1}"
                self.uploads.append({"request": asked[-1], "body": body, "reference": reference})
                self.files[reference] = body
            return 200, b"", {"x-encrypted-param": reference}
        return 404, b"", {}

    def _getuploadurl(self, body: dict) -> dict:
        with self._cond:
            param = f"up-{len(self.upload_requests) + 1}"
            self.upload_requests.append({**body, "upload_param": param})
            reply = self.upload_replies.pop(0) if self.upload_replies else None
        if reply is not None:
            return reply
        if self.upload_full:
            return {"upload_full_url": f"{self.cdn_url}/upload?encrypted_query_param={param}&filekey={body.get('filekey')}"}
        return {"upload_param": param}

    def received_files(self) -> list[tuple[int, str | None, bytes]]:
        """Each image or file item sent, in order: (item type, file name (None for an image: the protocol
        carries none), the uploaded bytes decrypted with the item's own `aes_key`)."""
        from ias.channels.wechat.cdn import decrypt, parse_key
        found = []
        with self._cond:
            for msg in self.sent:
                item = msg["item_list"][0]
                holder = item.get("image_item") or item.get("file_item")
                if holder is not None:
                    media = holder["media"]
                    found.append((item["type"], holder.get("file_name"),
                                  decrypt(parse_key(media["aes_key"]), self.files[media["encrypt_query_param"]])))
        return found

    @staticmethod
    def _item_ok(item: dict) -> bool:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == 1:
            return isinstance(item.get("text_item", {}).get("text"), str)
        holder = item.get({2: "image_item", 4: "file_item"}.get(kind, ""), {})
        media = holder.get("media", {})
        if set(media) != {"encrypt_query_param", "aes_key", "encrypt_type"} or media["encrypt_type"] != 1:
            return False
        if kind == 2:
            return isinstance(holder.get("mid_size"), int)
        return isinstance(holder.get("file_name"), str) and isinstance(holder.get("len"), str)

    def _sendmessage(self, body: dict) -> dict:
        msg = body.get("msg") if isinstance(body, dict) else None
        items = msg.get("item_list") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or msg.get("from_user_id") != "" or not msg.get("to_user_id") \
                or not str(msg.get("client_id", "")) or msg.get("message_type") != 2 or msg.get("message_state") != 2 \
                or not isinstance(items, list) or len(items) != 1 or not self._item_ok(items[0]):
            return self._problem(f"sendmessage with {body!r}")
        with self._cond:
            self.sent.append(msg)
            reply = self.send_replies.pop(0) if self.send_replies else {"ret": 0, "errmsg": ""}
        if reply.get("hold"):               # the message landed; the answer comes late
            time.sleep(reply["hold"])
        return {k: v for k, v in reply.items() if k != "hold"}

    # -- life -------------------------------------------------------------------------------
    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        super().close()

"""The iLink HTTP client (ias/channels/wechat/ilink.py) against the local iLink server: requests, response limits, errors."""
import base64
import unittest

from ias import limits, version
from ias.channels.wechat.ilink import (GET_QRCODE, GET_UPDATES, QRCODE_STATUS, ILink, WeChatError, client_version,
                                       error_code)
from tests.servers import closed_port
from tests.servers.ilink import ILinkServer

OK = b"HTTP/1.1 200 OK\r\n"


def response(body: bytes, head: bytes = OK, length: bool = True) -> bytes:
    """A raw HTTP response: `head` (status line and headers), Content-Length unless told not to, `body`."""
    return head + (b"Content-Length: %d\r\n" % len(body) if length else b"") + b"\r\n" + body


class ClientTestCase(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.server = ILinkServer(hold=0.05).start()
        self.api = ILink(self.server.base_url + "/", self.server.token)

    async def asyncTearDown(self) -> None:
        self.server.close()
        self.assertEqual(self.server.problems, [])

    async def poll(self, timeout: float = 5.0) -> dict:
        return await self.api.call(GET_UPDATES, {"get_updates_buf": ""}, timeout)

    async def refused(self, raw: bytes) -> str:
        """The WeChatError message for a getupdates answered with `raw`."""
        self.server.raw.append(raw)
        with self.assertRaises(WeChatError) as caught:
            await self.poll()
        return str(caught.exception)


class RequestTest(ClientTestCase):
    async def test_authenticated_call_carries_the_protocol_headers_and_base_info(self):
        self.assertEqual(client_version(), "132099")
        self.assertEqual(client_version("1.2.3"), str(1 << 16 | 2 << 8 | 3))
        self.assertEqual((await self.poll())["ret"], 0)
        self.assertEqual((await self.poll())["get_updates_buf"], "buf-0")
        first, second = self.server.calls("/ilink/bot/getupdates")      # the server checked the rest
        self.assertEqual(first.method, "POST")
        self.assertEqual(first.body, {"get_updates_buf": "",
                                      "base_info": {"channel_version": "2.4.3", "bot_agent": f"iAs/{version()}"}})
        self.assertEqual(first.headers["host"], self.server.host)
        self.assertEqual(first.headers["connection"], "close")
        self.assertEqual(first.headers["accept-encoding"], "identity")
        for request in (first, second):
            self.assertLess(int(base64.b64decode(request.headers["x-wechat-uin"]).decode()), 2 ** 32)
        uins = {r.headers["x-wechat-uin"] for r in self.server.requests}
        self.assertEqual(len(uins), 2)                          # new per request

    async def test_login_calls_carry_the_app_headers_but_no_token(self):
        api = ILink(self.server.base_url)
        reply = await api.post(GET_QRCODE, {"local_token_list": []}, 5)
        status = await api.get(f"{QRCODE_STATUS}?qrcode={reply['qrcode']}", 5)
        self.assertEqual(status["status"], "wait")
        for request in self.server.requests:
            self.assertEqual((request.headers["ilink-app-id"], request.headers["ilink-app-clientversion"]),
                             ("bot", "132099"))
            self.assertNotIn("authorization", request.headers)
            self.assertNotIn("base_info", request.body or {})
        self.assertEqual([r.method for r in self.server.requests], ["POST", "GET"])
        self.assertNotIn("content-length", self.server.requests[1].headers)

    async def test_unsafe_requests_are_refused_before_connecting(self):
        cases = [(ILink(self.server.base_url), "not logged in"),
                 (ILink(self.server.base_url, "token\r\nX-Injected: 1"), "invalid characters"),
                 (ILink(self.server.base_url, "令牌"), "not ASCII"),
                 (ILink(f"ftp://{self.server.host}", "t"), "not an http(s) URL"),
                 (ILink("http://127.0.0.1:port", "t"), "not a valid URL"),
                 (ILink("http://:80", "t"), "not an http(s) URL")]
        for api, needle in cases:
            with self.subTest(api.base_url), self.assertRaises(WeChatError) as caught:
                await api.call(GET_UPDATES, {"get_updates_buf": ""}, 5)
            self.assertIn(needle, str(caught.exception))
            self.assertNotIn("令牌", str(caught.exception))
        self.assertEqual(self.server.requests, [])

    async def test_unreachable_and_slow_servers_raise_os_and_timeout_errors(self):
        with self.assertRaises(OSError):
            await ILink(f"http://127.0.0.1:{closed_port()}", "t").call(GET_UPDATES, {}, 5)
        self.server.hold = 5.0
        with self.assertRaises(TimeoutError):
            await self.poll(timeout=0.2)


class ReplyTest(ClientTestCase):
    async def test_http_errors_and_replies_that_are_no_json_object(self):
        self.server.updates.append({"http": 500})
        with self.assertRaisesRegex(WeChatError, r"^HTTP 500 from ilink/bot/getupdates$"):
            await self.poll()
        with self.assertRaisesRegex(WeChatError, r"^HTTP 404 from ilink/bot/nothing$"):
            await self.api.call("ilink/bot/nothing?x=1", {}, 5)
        self.assertIn("did not answer JSON", await self.refused(response(b"<html>busy</html>")))
        self.assertIn("did not answer JSON", await self.refused(response(b"\xff\xfe{}")))
        self.assertIn("did not answer JSON", await self.refused(response(b"[" * 100_000 + b"]" * 100_000)))
        self.assertIn("not answer a JSON object", await self.refused(response(b'["ret", 0]')))

    async def test_chunked_and_interim_responses_are_decoded(self):
        self.server.raw.append(OK + b"Transfer-Encoding: chunked\r\n\r\n"
                               b"4;ext=1\r\n{\"re\r\n6\r\nt\": 7}\r\n0\r\nX-Trailer: 1\r\n\r\n")
        self.assertEqual(await self.poll(), {"ret": 7})
        self.server.raw.append(b"HTTP/1.1 100 Continue\r\n\r\n" + response(b'{"ret": 0}'))
        self.assertEqual(await self.poll(), {"ret": 0})
        self.server.raw.append(OK + b"\r\n" + b'{"ret": 1}')              # delimited by the closed connection
        self.assertEqual(await self.poll(), {"ret": 1})

    async def test_response_limits(self):
        most = limits.WECHAT_RESPONSE_MAX
        self.assertIn(f"response of {most + 1} bytes refused",
                      await self.refused(OK + b"Content-Length: %d\r\n\r\n{}" % (most + 1)))
        self.assertIn("response too large",
                      await self.refused(OK + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (most + 1)))
        self.assertIn("response too large", await self.refused(OK + b"\r\n" + b" " * (most + 1)))
        headers = b"".join(b"X-Filler-%d: 1\r\n" % n for n in range(limits.WECHAT_HEADERS_MAX))
        self.assertIn("too many response headers", await self.refused(response(b"{}", OK + headers)))
        trailers = b"".join(b"X-Trailer-%d: 1\r\n" % n for n in range(limits.WECHAT_HEADERS_MAX + 1))
        self.assertIn("too many trailer lines",
                      await self.refused(OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n" + trailers))
        self.assertIn("bad HTTP response", await self.refused(OK + b"X-Long: " + b"a" * 100_000 + b"\r\n\r\n{}"))
        largest = b'{"ret": 3' + b" " * (most - 10) + b"}"                # exactly the limit is accepted
        self.server.raw.extend([response(largest), response(largest, length=False)])
        self.assertEqual(await self.poll(), {"ret": 3})
        self.assertEqual(await self.poll(), {"ret": 3})

    async def test_malformed_or_truncated_responses_are_wechat_errors(self):
        cases = {b"": "connection closed before a response",
                 b"HTTP/1.1\r\n\r\n": "bad HTTP response",
                 b"HTTP/1.1 OK 200\r\n\r\n": "bad HTTP response",
                 OK + b"Content-Length: ten\r\n\r\n{}": "bad HTTP response",
                 OK + b"Content-Length: -1\r\n\r\n": "response of -1 bytes refused",
                 OK + b"Content-Length: 100\r\n\r\n{\"ret\": 0}": "bad HTTP response",
                 OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n": "bad HTTP response",
                 OK + b"Transfer-Encoding: chunked\r\n\r\n10\r\n{}": "bad HTTP response",
                 OK + b"X-No-End: 1\r\n": "did not answer JSON"}
        for raw, needle in cases.items():
            with self.subTest(raw[:40]):
                self.assertIn(needle, await self.refused(raw))

    def test_error_code_is_the_first_nonzero_integer(self):
        self.assertEqual(error_code({"ret": 0, "errcode": -14}), -14)
        self.assertEqual(error_code({"ret": -2, "errcode": -14}), -2)
        self.assertEqual(error_code({"ret": True, "errcode": "-14"}), 0)
        self.assertEqual(error_code({"ret": 1.5}), 0)
        self.assertEqual(error_code({}), 0)


if __name__ == "__main__":
    unittest.main()

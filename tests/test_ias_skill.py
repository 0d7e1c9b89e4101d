"""The ias_skill helper that skill scripts import (resources/lib, on a skill's PYTHONPATH).

HTTP against a local server on 127.0.0.1 (gzip, status codes, timeout, size cap); the result
JSON of `run()` through a real `$IAS_PYTHON` subprocess with the runner's PYTHONPATH; the
process-group check against real processes.
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
from unittest import mock

from tests.servers import JSONHandler, JSONServer, closed_port
from tests.support import SKILL_LIB

if SKILL_LIB not in sys.path:       # what the runner's PYTHONPATH gives a skill
    sys.path.append(SKILL_LIB)
import ias_skill  # noqa: E402
from ias_skill import SkillError  # noqa: E402


class RawServer(JSONServer):
    """Answers each request with the next scripted (status, headers, body); records what it got."""

    def __init__(self):
        self.answers: list[tuple[int, dict, bytes]] = []
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.release = threading.Event()        # a `hold` answer waits for this
        server = self

        class Handler(JSONHandler):
            def answer(self, method: str) -> None:
                body = self.read_body()
                server.requests.append((method, self.path, self.lowered_headers(), body))
                status, headers, data = server.answers.pop(0)
                if headers.pop("hold", None):
                    server.release.wait(10)
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass            # the client gave up (the timeout test)

            def do_GET(self):
                self.answer("GET")

            def do_POST(self):
                self.answer("POST")

        self.listen(Handler)

    def script(self, status: int = 200, body: object = None, *, raw: bytes | None = None, gzipped: bool = False,
               **headers: str) -> None:
        data = raw if raw is not None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        if gzipped:
            data = gzip.compress(data)
            headers["Content-Encoding"] = "gzip"
        self.answers.append((status, {"Content-Type": "application/json", **headers}, data))


class RequestJSONTest(unittest.TestCase):
    def setUp(self):
        self.server = RawServer().start()
        self.addCleanup(self.server.close)
        self.addCleanup(self.server.release.set)

    def call(self, path: str = "/x", **options):
        options.setdefault("service", "Svc")
        options.setdefault("timeout", 5)
        return ias_skill.request_json(self.server.base_url + path, **options)

    def test_get_with_query_and_gzip(self):
        self.server.script(body={"城市": "北京", "n": 1}, gzipped=True)
        with mock.patch.dict(os.environ, {"IAS_SKILL": "query_weather"}):
            status, data = self.call("/geo", query={"location": "北京", "number": 1}, headers={"X-Key": "k"})
        self.assertEqual((status, data), (200, {"城市": "北京", "n": 1}))
        ((method, path, headers, body),) = self.server.requests
        self.assertEqual((method, body), ("GET", b""))
        self.assertEqual(path, "/geo?location=%E5%8C%97%E4%BA%AC&number=1")
        self.assertEqual(headers["accept-encoding"], "gzip")
        self.assertEqual(headers["x-key"], "k")
        self.assertEqual(headers["user-agent"], f"iAs-skill/{ias_skill.VERSION} (query_weather)")
        self.assertNotIn("content-type", headers)

    def test_post_sends_json(self):
        self.server.script(body={"ok": True})
        status, data = self.call("/search", body={"query": "天气", "max_results": 2},
                                 headers={"Authorization": "Bearer t"})
        self.assertEqual((status, data), (200, {"ok": True}))
        ((method, path, headers, body),) = self.server.requests
        self.assertEqual((method, path, headers["content-type"]), ("POST", "/search", "application/json"))
        self.assertEqual(headers["authorization"], "Bearer t")
        self.assertEqual(json.loads(body), {"query": "天气", "max_results": 2})

    def test_gzip_without_the_header_and_plain_bodies(self):
        self.server.script(raw=gzip.compress(b'{"a": 1}'))         # magic bytes, no Content-Encoding
        self.server.script(raw=b"<html>not json</html>", **{"Content-Type": "text/html"})
        self.server.script(raw=b"")
        self.assertEqual(self.call(), (200, {"a": 1}))
        self.assertEqual(self.call(), (200, None))
        self.assertEqual(self.call(), (200, None))

    def test_an_error_status_is_returned_with_its_body(self):
        self.server.script(401, {"error": {"status": 401, "title": "Unauthorized"}}, gzipped=True)
        self.server.script(503, raw=b"Service Unavailable")
        self.assertEqual(self.call(), (401, {"error": {"status": 401, "title": "Unauthorized"}}))
        self.assertEqual(self.call(), (503, None))

    def test_size_cap(self):
        self.server.script(raw=b'"' + b"x" * 98 + b'"')             # exactly the limit: fine
        self.assertEqual(self.call(limit=100), (200, "x" * 98))
        for options in ({"raw": b'"' + b"x" * 99 + b'"'},           # one byte over, as sent
                        {"raw": b" " * 10_000 + b"1", "gzipped": True}):    # small gzip, large inside
            with self.subTest(options=list(options)):
                self.server.script(**options)
                with self.assertRaises(SkillError) as caught:
                    self.call(limit=100)
                self.assertEqual(str(caught.exception), "Svc 返回的数据过大（超过 100 字节）")
        self.server.script(413, raw=b"e" * 200)                     # an error body is capped too
        with self.assertRaises(SkillError):
            self.call(limit=100)
        self.assertLess(len(gzip.compress(b" " * 10_000 + b"1")), 100)

    def test_broken_gzip(self):
        whole = gzip.compress(b'{"a": 1}')
        for raw in (whole[:-6], whole[:3] + b"\0" * 20):
            with self.subTest(raw=raw):
                self.server.script(raw=raw, **{"Content-Encoding": "gzip"})
                with self.assertRaises(SkillError) as caught:
                    self.call()
                self.assertTrue(str(caught.exception).startswith("Svc 返回的数据无法解压："), caught.exception)

    def test_timeout(self):
        self.server.script(body={}, hold="1")
        started = time.monotonic()
        with self.assertRaises(SkillError) as caught:
            self.call(timeout=0.2)
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(str(caught.exception), "Svc 请求超时（0.2 秒），请稍后再试")

    def test_unreachable(self):
        port = closed_port()
        with self.assertRaises(SkillError) as caught:
            ias_skill.request_json(f"http://127.0.0.1:{port}/x", service="Svc", timeout=5)
        self.assertTrue(str(caught.exception).startswith(f"无法连接 Svc（127.0.0.1:{port}）："), caught.exception)

    def test_keys_never_follow_a_redirect_to_another_origin(self):
        other = RawServer().start()         # another port on 127.0.0.1: another origin
        self.addCleanup(other.close)
        secret = {"X-QW-Api-Key": "k-secret", "Authorization": "Bearer t-secret"}
        self.server.script(302, raw=b"", Location=other.base_url + "/elsewhere")
        other.script(body={"ok": True})
        self.assertEqual(self.call("/start", headers=secret), (200, {"ok": True}))
        ((_m, path, headers, _b),) = other.requests
        self.assertEqual(path, "/elsewhere")
        self.assertNotIn("x-qw-api-key", headers)
        self.assertNotIn("authorization", headers)
        self.assertNotIn("k-secret", repr(headers))
        self.assertEqual(headers["accept-encoding"], "gzip")            # the request itself still goes

    def test_keys_follow_a_redirect_on_the_same_origin(self):
        self.server.script(301, raw=b"", Location="/moved")
        self.server.script(body={"ok": True})
        self.assertEqual(self.call("/start", headers={"X-Api-Key": "k"}), (200, {"ok": True}))
        self.assertEqual([(p, h.get("x-api-key")) for _m, p, h, _b in self.server.requests],
                         [("/start", "k"), ("/moved", "k")])

    def test_origin(self):
        self.assertEqual(ias_skill.origin("HTTPS://Api.Example.com/x"), ("https", "api.example.com", 443))
        self.assertEqual(ias_skill.origin("http://127.0.0.1:8080/"), ("http", "127.0.0.1", 8080))
        self.assertIsNone(ias_skill.origin("http://127.0.0.1:99999/"))
        self.assertNotEqual(ias_skill.origin("http://h/"), ias_skill.origin("https://h/"))


class ConfigurationTest(unittest.TestCase):
    def test_require_names_the_variable(self):
        self.assertEqual(ias_skill.require("X_KEY", "设置它", {"X_KEY": " k "}), "k")
        for environ in ({}, {"X_KEY": "  "}):
            with self.assertRaises(SkillError) as caught:
                ias_skill.require("X_KEY", "设置它", environ)
            self.assertEqual(caught.exception.result(), {"success": False, "error": "未配置 X_KEY：设置它"})

    def test_base_url(self):
        self.assertEqual(ias_skill.base_url(" host.example/ ", "X_URL"), "https://host.example")
        self.assertEqual(ias_skill.base_url("http://127.0.0.1:81/v1/", "X_URL"), "http://127.0.0.1:81/v1")
        self.assertEqual(ias_skill.base_url(None, "X_URL", default="https://d.example"), "https://d.example")
        with self.assertRaisesRegex(SkillError, "^未配置 X_URL：给个地址$"):
            ias_skill.base_url("", "X_URL", hint="给个地址")
        for bad in ("ftp://h", "http://", "a b.example"):
            with self.subTest(bad=bad), self.assertRaisesRegex(SkillError, "^X_URL 无效："):
                ias_skill.base_url(bad, "X_URL")


class OutputTest(unittest.TestCase):
    """`run()` in a real interpreter with the runner's PYTHONPATH: exactly one JSON line, exit 0."""

    def run_script(self, body: str, stdin: str = "{}") -> dict:
        script = "import sys, ias_skill\nfrom ias_skill import SkillError\n" + body
        done = subprocess.run([sys.executable, "-c", script], input=stdin.encode(), capture_output=True,
                              env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONPATH": SKILL_LIB},
                              timeout=30)
        self.assertEqual((done.returncode, done.stderr), (0, b""))
        (line,) = done.stdout.decode("utf-8").splitlines()
        return json.loads(line)

    def test_results(self):
        echo = "ias_skill.run(lambda text: {'success': True, 'got': ias_skill.params(text)}, '失败')"
        self.assertEqual(self.run_script(echo, '{"城市": "北京"}'), {"success": True, "got": {"城市": "北京"}})
        self.assertEqual(self.run_script(echo, ""), {"success": True, "got": {}})
        self.assertEqual(self.run_script(echo, "not json"), {"success": False, "error": "参数不是有效的 JSON"})
        self.assertEqual(self.run_script(echo, "[1]"), {"success": False, "error": "参数必须是 JSON 对象"})
        missing = "ias_skill.run(lambda text: ias_skill.require('X_KEY', '请设置', {}), '失败')"
        self.assertEqual(self.run_script(missing), {"success": False, "error": "未配置 X_KEY：请设置"})
        fields = "def main(text):\n    raise SkillError('坏了', uid='7')\nias_skill.run(main, '失败')"
        self.assertEqual(self.run_script(fields), {"success": False, "error": "坏了", "uid": "7"})
        bug = "ias_skill.run(lambda text: {}['k'], '天气查询失败')"
        self.assertEqual(self.run_script(bug), {"success": False, "error": "天气查询失败：KeyError: 'k'"})

    def test_a_result_too_large_is_never_cut_into_invalid_json(self):
        long_error = "ias_skill.run(lambda text: ias_skill.require('X', '字' * 40000, {}), '失败')"
        result = self.run_script(long_error)
        self.assertIs(result["success"], False)
        self.assertLessEqual(len(ias_skill.encoded(result)), ias_skill.OUTPUT_MAX)
        self.assertTrue(result["error"].startswith("未配置 X：字字"))
        huge = "ias_skill.run(lambda text: {'success': True, 'data': ['x'] * 40000}, '失败')"
        self.assertEqual(self.run_script(huge), {"success": False, "error": "the result was too large to return"})

    def test_fit_text(self):
        small = {"success": True, "body": "短"}
        self.assertEqual(ias_skill.fit_text(dict(small), "body", "cut"), small)
        result = ias_skill.fit_text({"success": True, "body": "😀" * 30000}, "body", "cut")
        self.assertIs(result["cut"], True)
        size = len(ias_skill.encoded(result))
        self.assertLessEqual(size, ias_skill.OUTPUT_MAX)
        self.assertGreater(size, ias_skill.OUTPUT_MAX - 8)         # the longest prefix that fits


class GroupAliveTest(unittest.TestCase):
    def test_a_group_with_only_a_zombie_is_not_alive(self):
        proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
        self.addCleanup(proc.wait)
        self.addCleanup(ias_skill.signal_group, proc.pid, signal.SIGKILL)
        self.assertTrue(ias_skill.group_alive(proc.pid))
        self.assertTrue(ias_skill.signal_group(proc.pid, signal.SIGKILL))
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)     # dead, not yet reaped: a zombie
        self.assertFalse(ias_skill.group_alive(proc.pid))
        proc.wait()
        self.assertFalse(ias_skill.signal_group(proc.pid, 0))
        self.assertFalse(ias_skill.group_alive(proc.pid))


if __name__ == "__main__":
    unittest.main()

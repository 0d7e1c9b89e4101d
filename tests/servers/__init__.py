"""Local stand-ins for the services iAs talks to, all on 127.0.0.1: no test reaches the internet.

The HTTP ones share `JSONServer` (a free port, a daemon thread, `with` to start and close) and
`JSONHandler` (quiet, HTTP/1.1, `send_json`); each keeps its own protocol.
"""
from __future__ import annotations

import gzip
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers JSON (`ensure_ascii` as json.dumps)."""
    protocol_version = "HTTP/1.1"
    ensure_ascii = False

    def log_message(self, *args):
        pass

    def lowered_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(self, status: int, body: object, *, gzipped: bool = False,
                  content_type: str = "application/json") -> None:
        """`body` as JSON with Content-Length (gzip-compressed, with Content-Encoding, if `gzipped`)."""
        data = json.dumps(body, ensure_ascii=self.ensure_ascii).encode("utf-8")
        if gzipped:
            data = gzip.compress(data)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class QuietHTTPServer(ThreadingHTTPServer):
    """A client that goes away between two requests of a kept-alive connection (a daemon killed, a test's client
    closed) is expected, not a traceback printed into the run; any other error is still printed."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class JSONServer:
    """An HTTP server on a free port of 127.0.0.1, served from a daemon thread.

    A subclass calls `listen(handler)` in `__init__`; then `with server:` (or `start()` and
    `close()`). `port`, `host` ("127.0.0.1:port") and `base_url` ("http://host") are set by `listen`.
    """
    server_class: type[ThreadingHTTPServer] = QuietHTTPServer

    def listen(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = self.server_class(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.base_url = f"http://{self.host}"

    def start(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

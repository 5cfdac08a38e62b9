"""A local HTTP server for unit tests of what kai-ray's clients send and how they read answers
(request bodies, counts, pacing). Not an API server: each test decides every answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """Reads each request's JSON body, lets `answer` pick the status code and the body, and
    writes that back as JSON."""

    def answer(self, body: dict) -> tuple[int, bytes]:
        raise NotImplementedError

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        code, data = self.answer(json.loads(self.rfile.read(length)) if length else {})
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _handle

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[JsonHandler]) -> Iterator[str]:
    """`handler` on a free local port, in a thread; yields the base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()

"""A real JSON webhook on 127.0.0.1 for notification tests (Apprise ``json://``)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time


class Webhook:
    """A JSON webhook on 127.0.0.1: every POST's path and body, kept."""

    def __init__(self, port: int = 0):
        got = self.got = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, what: str, every=None):
    deadline = time.monotonic() + timeout
    while not cond():
        if every:
            every()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)

"""A real webhook endpoint for tests: an HTTP server that keeps every JSON body it is sent."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import ClassVar


class Receiver(BaseHTTPRequestHandler):
    """Serve with `HTTPServer(("127.0.0.1", 0), Receiver)`; reset `Receiver.got` before each use."""

    got: ClassVar[list] = []

    def do_POST(self) -> None:
        Receiver.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass

"""A webhook URL is a credential (Slack's secret is its path): the server's log names a webhook by its
place in the list, scheme and host, never its user, path or query, whether it fails or cannot be reached."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

from tests.utils.servers import free_port
from tests.utils.wait import until
from tunedeck.config import Settings
from tunedeck.services.alerting.notify import Notifier

SLACK_PATH = "/services/T0SECRET1/B0SECRET2/XsEcReTpAtH0123456789ab"
QUERY = "token=QuErYsEcReT"
SECRETS = ("T0SECRET1", "B0SECRET2", "XsEcReTpAtH", "QuErYsEcReT", "UnReAcHaBlE", "pAsSwOrD", "hooker")


class Failing(BaseHTTPRequestHandler):
    """A webhook receiver that is up and answers every POST with 500."""

    paths: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        Failing.paths.append(self.path)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


def test_a_failing_and_an_unreachable_webhook_are_logged_by_scheme_and_host_only(tmp_path, caplog):
    http = HTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    up, down = http.server_port, free_port()  # nothing listens on `down`
    urls = [
        f"http://127.0.0.1:{up}{SLACK_PATH}?{QUERY}",
        f"http://hooker:pAsSwOrD@127.0.0.1:{down}/services/T1/B1/UnReAcHaBlE",
    ]
    caplog.set_level(logging.DEBUG)  # httpx's request line (INFO) and httpcore's too
    notifier = Notifier(Settings(workspace=tmp_path, webhook_urls=urls, webhook_retries=1))
    Failing.paths = []
    notifier.start()
    try:
        notifier.job_finished(7, status="failed", error="boom")
        until(
            lambda: sum("failed after 2 tries" in r.getMessage() for r in caplog.records) == 2,
            "both webhooks given up",
        )
    finally:
        notifier.stop()
        http.shutdown()
    assert Failing.paths == [f"{SLACK_PATH}?{QUERY}"] * 2  # the receiver was sent the whole URL, twice
    logged = "\n".join(f"{r.threadName} {r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert not [s for s in SECRETS if s in logged], logged
    assert f"webhook 1 (http://127.0.0.1:{up}) failed after 2 tries: HTTP 500" in logged, logged
    assert f"webhook 2 (http://127.0.0.1:{down}) failed after 2 tries: ConnectError: " in logged, logged
    # httpx's own line for each request is there, with the path hidden
    assert logged.count(f'HTTP Request: POST http://127.0.0.1:{up}/… "HTTP/1.0 500') == 2, logged
    # and the lanes' threads (what a log format with %(threadName)s shows) are named the same way
    assert {r.threadName for r in caplog.records if r.name == "tunedeck.notify"} == {
        f"webhook 1 (http://127.0.0.1:{up})",
        f"webhook 2 (http://127.0.0.1:{down})",
    }

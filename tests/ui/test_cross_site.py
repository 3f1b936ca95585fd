"""Another site open in a teammate's browser: it cannot submit or cancel on a loopback server with
open writes. And runner-supplied text on the charts stays text."""

from __future__ import annotations

import html
import http.server
import json
import sqlite3
import threading

import pytest
import yaml

from tests.ui.conftest import shot
from tests.utils.servers import demo_config

pytestmark = pytest.mark.browser

ATTACK = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="yaml" method="post" enctype="text/plain" target="sink" action="TARGET/api/jobs/yaml?name=evil-form">
  <input name="NAME" value="VALUE"></form>
<form id="cancel" method="post" target="sink" action="TARGET/api/jobs/JOB/cancel"></form>
<script>
const target = "TARGET";
const yaml = YAML;
const frame = document.querySelector("iframe");
let loads = 0;
frame.addEventListener("load", () => { loads++; if (loads === 1) document.getElementById("cancel").submit(); });
window.results = {};
window.fetchesDone = Promise.allSettled([
  fetch(`${target}/api/jobs/yaml?name=evil-fetch`, { method: "POST", mode: "no-cors",
    headers: { "Content-Type": "text/plain" }, body: yaml }),
  fetch(`${target}/api/jobs/JOB/cancel`, { method: "POST", mode: "no-cors" }),
  fetch(`${target}/api/jobs/yaml?name=evil-cors`, { method: "POST",
    headers: { "Content-Type": "application/yaml", "X-Tunedeck": "1" }, body: yaml }),
]).then((r) => { window.results = r.map((x) => x.status); return true; });
window.formsDone = () => loads >= 2;
document.getElementById("yaml").submit();
</script></body></html>"""


def attacker_site(page_html: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A plain web server on another port: another origin."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page_html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/"


def test_another_site_cannot_submit_or_cancel(server_factory, assets, page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")  # the default: loopback, open writes
    job = server.submit({"name": "mine", "config": demo_config(assets)})
    yaml_text = yaml.safe_dump(demo_config(assets), sort_keys=False)
    # A text/plain form sends `name=value`: the field's name carries the YAML, a comment swallows `=`.
    field = html.escape(yaml_text + "#").replace("\n", "&#10;")
    page_html = (
        ATTACK.replace("TARGET", server.url)
        .replace("JOB", str(job["id"]))
        .replace("YAML", json.dumps(yaml_text))
        .replace("NAME", field)
        .replace("VALUE", "")
    )
    httpd, url = attacker_site(page_html)
    try:
        page.goto(url)
        assert page.evaluate("window.fetchesDone") is True
        page.wait_for_function("window.formsDone()")
        results = page.evaluate("window.results")
    finally:
        httpd.shutdown()
    shot(page, "cross-site-attempts")
    # Opaque no-cors answers, and the CORS one stopped at its preflight: the page learns nothing.
    assert results == ["fulfilled", "fulfilled", "rejected"]
    jobs = server.api.get("/api/jobs").json()["jobs"]
    assert [(j["name"], j["status"]) for j in jobs] == [("mine", "queued")]
    log = "".join(p.read_text() for p in server.workspace.glob("server-*.log"))
    for request in (
        "POST /api/jobs/yaml?name=evil-fetch",
        "POST /api/jobs/yaml?name=evil-form",
        f"POST /api/jobs/{job['id']}/cancel",
    ):
        assert f'{request} HTTP/1.1" 403' in log, request  # they reached the server and were refused


def test_gpu_names_are_text_in_the_chart_legend(server_factory, assets, strict_page):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    job = server.submit({"name": "held", "config": demo_config(assets)})
    evil = '<a href="https://evil.example/">MI300X</a><b>bold</b>'
    gib = 1 << 30
    with sqlite3.connect(server.workspace / "tunedeck.db") as db:
        for line in range(3):
            db.execute(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name) "
                "VALUES (?, ?, ?, 0, ?, ?, ?)",
                (job["id"], line, 1000.0 + line, (10 + line) * gib, 192 * gib, evil),
            )
        db.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t, "
            "last_t, count) VALUES (?, 'vram_spike', 'warning', 0, 1001.0, NULL, ?, 'x', 1, 1001.0, 1001.0, 1)",
            (job["id"], evil),
        )
    page = strict_page
    page.goto(f"{server.url}/jobs/{job['id']}")
    legend = page.locator("#mem-chart .legend")
    legend.locator("text", has_text="MI300X").first.wait_for()
    text = legend.text_content()
    assert '<a href="https://evil.example/">MI300X</a>' in text  # shown as written
    assert page.locator("#mem-chart a").count() == 0
    assert page.locator("#mem-chart [href*='evil.example']").count() == 0
    assert page.locator("#mem-chart b").count() == 0
    shot(page, "gpu-name-as-text")
    for path in ("/new", "/compare", "/nodes"):  # every page runs under the Content-Security-Policy
        page.goto(f"{server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.tunedeckReady") is True, path
    page.goto(f"{server.url}/")
    page.locator(f'tr[data-job="{job["id"]}"]').wait_for()
    assert page.csp_violations == [] and page.errors == []

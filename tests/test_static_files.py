"""Static files over a real server: gzipped for a client that accepts it (plotly's bundle is most of
a first visit's bytes), revalidated with ETag / Last-Modified, and the plain bytes for one that does
not. The API's event streams do not pass through the compression (tests/test_stream.py)."""

from __future__ import annotations

import gzip
import re

import httpx
import pytest

from tunedeck.services.views.report import PLOTLY_JS

GZIP = {"Accept-Encoding": "gzip"}
IDENTITY = {"Accept-Encoding": "identity"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    from tests.utils.servers import Server

    s = Server(tmp_path_factory.mktemp("static") / "ws", assets).start()
    yield s
    s.stop()


def raw(server, path: str, headers: dict) -> httpx.Response:
    """The response as it crossed the wire: httpx would otherwise decode the gzip itself."""
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("GET", path, headers=headers) as r,
    ):
        r.wire = b"".join(r.iter_raw())
        return r


def bundle_url(server) -> str:
    (src,) = set(
        re.findall(r'href="(/static/vendor/[0-9a-f]{16}/plotly\.min\.js)"', server.api.get("/jobs/1").text)
    )
    return src


@pytest.mark.parametrize("which", ["versioned", "unversioned"])
def test_plotly_is_sent_gzipped_smaller_and_whole(server, which):
    path = bundle_url(server) if which == "versioned" else "/static/vendor/plotly.min.js"
    r = raw(server, path, GZIP)
    size = PLOTLY_JS.stat().st_size
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in r.headers["vary"].lower()
    assert len(r.wire) < size / 2, (len(r.wire), size)
    assert gzip.decompress(r.wire) == PLOTLY_JS.read_bytes()
    want = "public, max-age=31536000, immutable" if which == "versioned" else "no-cache"
    assert r.headers["cache-control"] == want
    assert r.headers["etag"] and r.headers["last-modified"]


def test_a_client_without_gzip_gets_the_plain_file(server):
    r = raw(server, bundle_url(server), IDENTITY)
    assert r.status_code == 200 and "content-encoding" not in r.headers
    assert r.wire == PLOTLY_JS.read_bytes()


@pytest.mark.parametrize("path", ["/static/js/job.js", "/static/css/app.css", "bundle"])
def test_a_conditional_request_gets_304_without_a_body(server, path):
    path = bundle_url(server) if path == "bundle" else path
    first = raw(server, path, GZIP)
    assert first.status_code == 200 and first.headers["content-encoding"] == "gzip"
    again = raw(server, path, {**GZIP, "If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.wire == b""
    since = raw(server, path, {**GZIP, "If-Modified-Since": first.headers["last-modified"]})
    assert since.status_code == 304 and since.wire == b""


def test_a_missing_static_file_is_still_a_404(server):
    assert server.api.get("/static/js/nope.js").status_code == 404
    assert server.api.get("/static/vendor/0123456789abcdef/plotly.min.js").status_code == 404


@pytest.mark.browser
@pytest.mark.parametrize("width", [1440, 390])
def test_the_browser_gets_plotly_gzipped_and_draws_with_it(server, browser, width):
    """A real Chromium, as a team member's: the bundle crosses the wire gzipped (under half its size)
    and the page's charts run on it, on a wide screen and a phone."""
    job = server.api.post(
        "/api/runs/import",
        files={"trainer_log": b'{"current_steps": 1, "total_steps": 2, "loss": 2.5}\n'},
        data={"name": f"gzip {width}"},
    ).json()
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        seen = []
        page.on("requestfinished", lambda r: seen.append(r) if r.url.endswith("/plotly.min.js") else None)
        page.goto(f"{server.url}/jobs/{job['id']}")
        page.locator("#loss-chart .main-svg").first.wait_for()
        (request,) = seen
        response = request.response()
        assert response.status == 200 and response.headers["content-encoding"] == "gzip"
        assert request.sizes()["responseBodySize"] < PLOTLY_JS.stat().st_size / 2, request.sizes()
    finally:
        context.close()

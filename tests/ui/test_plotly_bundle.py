"""Which plotly.js the pages load: the basic bundle scripts/fetch_js.py installs when it is there, the
Python package's full one when it is not, under a URL that changes with the bytes and is cached for
good. And the fetch script trusts nothing in a tarball but the one file whose hash it pinned."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import subprocess
import tarfile

import pytest

from tests.utils.layout import assemble
from tests.utils.servers import PYTHON, ROOT, Server, free_port
from tunedeck.services.views.report import FULL_JS

PACKAGE = ROOT / "backend" / "tunedeck"
FETCH = ROOT / "scripts" / "fetch_js.py"
MEMBER = "package/plotly-basic.min.js"
BUNDLE = b"/* plotly.js basic, a stand-in */ window.Plotly = window.Plotly || {};\n"
# The job page preloads it (job.js runs it), the compare page names it in a <script> tag.
SRC = re.compile(
    r'<(?:script|link rel="preload" as="script")[^>]* (?:src|href)="(/static/vendor/[0-9a-f]{16}/plotly\.min\.js)"'
)


def _tarball(*members: tarfile.TarInfo | tuple[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return out.getvalue()


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _fetch(tmp_path, data: bytes | None, *extra: str) -> subprocess.CompletedProcess:
    """The script run on a tarball written here (None: it downloads), from a folder of its own."""
    if data is not None:
        (tmp_path / "t.tgz").write_bytes(data)
        extra = ("--tarball", tmp_path / "t.tgz", *extra)
    work = tmp_path / "cwd"
    work.mkdir()
    return subprocess.run(
        [PYTHON, FETCH, "--dest", tmp_path / "out" / "b.js", *extra],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


def test_fetch_refuses_a_tarball_that_is_not_the_pinned_one(tmp_path):
    r = _fetch(tmp_path, _tarball((MEMBER, BUNDLE)))  # the right layout, not the pinned bytes
    assert r.returncode == 1 and "integrity mismatch" in r.stderr, r.stderr
    assert _files(tmp_path) == {"t.tgz"}


def test_fetch_writes_the_bundle_and_nothing_else_from_the_tarball(tmp_path):
    data = _tarball(
        ("package/README.md", b"readme"),
        ("../escaped.js", b"outside"),
        ("package/../../escaped2.js", b"outside"),
        _link("package/link.js", "/etc/passwd"),
        (MEMBER, BUNDLE),
    )
    r = _fetch(tmp_path, data, "--integrity", _integrity(data))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "b.js").read_bytes() == BUNDLE
    assert _files(tmp_path) == {"t.tgz", "out/b.js"}


@pytest.mark.parametrize("member", [_link(MEMBER, "/etc/passwd"), tarfile.TarInfo("package/other.js")])
def test_fetch_refuses_a_tarball_without_the_bundle_as_a_regular_file(tmp_path, member):
    data = _tarball(member)
    r = _fetch(tmp_path, data, "--integrity", _integrity(data))
    assert r.returncode == 1 and MEMBER in r.stderr, r.stderr
    assert _files(tmp_path) == {"t.tgz"}


def test_fetch_offline_says_so_and_writes_nothing(tmp_path):
    port = free_port()  # nothing listens there: what set-up meets on a cluster without internet
    r = _fetch(tmp_path, None, "--url", f"http://127.0.0.1:{port}/plotly.tgz")
    assert r.returncode == 1 and "not installed" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def _served(server: Server) -> tuple[str, bytes]:
    """The bundle the job and compare pages name, and its bytes; checks its caching headers."""
    (src,) = set(SRC.findall(server.api.get("/jobs/1").text + server.api.get("/compare").text))
    r = server.api.get(src)
    assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=31536000, immutable"
    # Our own modules keep their names across upgrades: asked again each visit, 304 while current.
    js = server.api.get("/static/js/job.js")
    assert js.status_code == 200 and js.headers["cache-control"] == "no-cache"
    again = server.api.get("/static/js/job.js", headers={"If-None-Match": js.headers["etag"]})
    assert again.status_code == 304
    return src, r.content


def test_pages_load_the_basic_bundle_when_installed_else_the_full_one(tmp_path, browser):
    # A copy of the package first on the server's path: installing the bundle there touches no checkout.
    assemble(tmp_path / "pkg" / "tunedeck", ignore=("__pycache__", "vendor"))
    server = Server(tmp_path / "ws", tmp_path, PYTHONPATH=str(tmp_path / "pkg")).start()
    try:
        full_src, body = _served(server)
        assert body == FULL_JS.read_bytes()
    finally:
        server.stop()
    vendor = tmp_path / "pkg" / "tunedeck" / "frontend" / "vendor"
    vendor.mkdir()
    (vendor / "plotly-basic.min.js").write_bytes(BUNDLE)
    server.start()
    try:
        basic_src, body = _served(server)
        assert body == BUNDLE and basic_src != full_src
        # The same context visits again: the immutable bundle comes from the cache, not the network.
        context = browser.new_context()
        page = context.new_page()
        for _ in range(2):
            page.goto(f"{server.url}/compare")  # waits for the load event: the bundle is not deferred there
            sizes = page.evaluate(
                "performance.getEntriesByType('resource').filter((e) => e.name.includes('/vendor/'))"
                ".map((e) => e.transferSize)"
            )
        context.close()
        assert sizes == [0]
    finally:
        server.stop()


def test_the_job_page_preloads_its_whole_module_graph():
    # A module imported but not preloaded is asked for only once its importer has arrived.
    js = ROOT / "frontend" / "js"
    graph, todo = set(), ["job.js"]
    while todo:
        name = todo.pop()
        if name not in graph:
            graph.add(name)
            todo += re.findall(r'^import .* from "\./([\w-]+\.js)";$', (js / name).read_text(), re.M)
    html = (ROOT / "frontend" / "job.html").read_text()
    assert set(re.findall(r'<link rel="modulepreload" href="/static/js/([\w-]+\.js)">', html)) == graph

"""The network guard against a real server: the write header, Origin, Host (DNS rebinding), the
security headers, and the bind rule wherever the app runs (plain uvicorn too)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from tests.security.test_auth import bearer, token
from tests.utils.servers import free_port
from tests.utils.wait import until

YAML = "stage: sft\ndo_train: true\nfinetuning_type: lora\n"


def non_loopback_address() -> str | None:
    """An IPv4 address of this host outside 127/8, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_writes_need_the_header_and_the_right_origin_and_host(server_factory, assets):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_ALLOWED_HOSTS='["gpu-box.lab"]')
    bare = httpx.Client(base_url=server.url, timeout=30)  # what a form or a no-cors fetch can send
    config = {
        "model_name_or_path": str(assets / "demo" / "model"),
        "dataset_dir": str(assets / "demo" / "data"),
        "dataset": "demo_identity",
        "template": "qwen",
        "stage": "sft",
        "finetuning_type": "lora",
    }
    yaml_text = "".join(f"{k}: {v}\n" for k, v in config.items())

    r = bare.post(
        "/api/jobs/yaml", params={"name": "x"}, content=yaml_text, headers={"content-type": "text/plain"}
    )
    assert r.status_code == 403, r.text
    assert r.json()["detail"][0]["loc"] == ["header", "X-Tunedeck"]
    assert bare.post("/api/jobs", json={"name": "x", "config": config}).status_code == 403
    job = server.submit({"name": "mine", "config": config})  # the same request with the header
    assert bare.post(f"/api/jobs/{job['id']}/cancel").status_code == 403
    assert (
        bare.post("/api/ui/parse-yaml", content=YAML, headers={"content-type": "text/plain"}).status_code
        == 403
    )
    assert bare.get("/api/jobs").status_code == 200  # reads need nothing

    # Origin: only the server's own (scheme, host, port), whatever the method.
    own = f"http://127.0.0.1:{server.port}"
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{server.port + 1}", "https://127.0.0.1"):
        r = server.api.post(f"/api/jobs/{job['id']}/cancel", headers={"Origin": origin})
        assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["header", "Origin"], origin
        assert server.api.get("/api/jobs", headers={"Origin": origin}).status_code == 403
    assert server.api.get(f"/api/jobs/{job['id']}").json()["status"] == "queued"
    r = server.api.post("/api/jobs", json={"name": "same-origin", "config": config}, headers={"Origin": own})
    assert r.status_code == 201, r.text

    # Host: a name the server was not configured for is a DNS-rebinding page.
    for host in ("attacker.example", f"attacker.example:{server.port}", "127.0.0.1.attacker.example"):
        r = bare.get("/api/jobs", headers={"Host": host})
        assert r.status_code == 400 and r.json()["detail"][0]["loc"] == ["header", "Host"], host
        assert bare.get("/", headers={"Host": host}).status_code == 400
    for host in (
        f"localhost:{server.port}",
        f"[::1]:{server.port}",
        f"gpu-box.lab:{server.port}",
        f"GPU-BOX.lab:{server.port}",
        f"192.0.2.7:{server.port}",
    ):  # an IP literal cannot be rebound
        assert bare.get("/api/jobs", headers={"Host": host}).status_code == 200, host

    jobs = server.api.get("/api/jobs").json()["jobs"]
    assert sorted(j["name"] for j in jobs) == ["mine", "same-origin"]

    # Every response says: no framing, no sniffing, scripts only from here.
    for r in (bare.get("/"), bare.get("/api/jobs"), bare.post("/api/jobs", json={}), bare.get("/nope")):
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-eval" not in csp


def test_health_names_no_paths(server_factory, tmp_path):
    server = server_factory(TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false")
    r = httpx.get(f"{server.url}/api/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert str(tmp_path) not in r.text and "workspace" not in r.json()


class Uvicorn:
    """`python -m uvicorn --factory tunedeck.main:create_app`: the app started without our CLI."""

    def __init__(self, workspace: Path, host: str, **env: str):
        self.port = free_port()
        self.log = workspace.parent / f"uvicorn-{host}-{self.port}.log"
        workspace.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "tunedeck.main:create_app",
                    "--host",
                    host,
                    "--port",
                    str(self.port),
                ],
                env={**os.environ, "TUNEDECK_WORKSPACE": str(workspace), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", timeout=30, headers={"X-Tunedeck": "1"}
        )
        until(self._answers, "an answer from uvicorn")

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            self.api.get("/api/health")  # any answer: it is up
            return True
        except httpx.HTTPError:
            return False

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()


def test_the_bind_rule_reads_only_this_processs_own_sockets():
    # The host's connection tables (what psutil reads) grow with everything else on the host; the
    # first request waits for this check. Run apart: an audit hook stays for the interpreter's life.
    code = """
import json, socket, sys
opened = []
sys.addaudithook(lambda e, a: e == "open" and str(a[0]).startswith("/proc/net/") and opened.append(a[0]))
from tunedeck.api.guard import listening_exposed
loop, every, idle = socket.socket(), socket.socket(), socket.socket()
loop.bind(("127.0.0.1", 0)), every.bind(("0.0.0.0", 0)), idle.bind(("127.0.0.1", 0))
loop.listen(), every.listen()
ports = [s.getsockname()[1] for s in (loop, every, idle)]
print(json.dumps([[listening_exposed(p) for p in ports], opened]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout) == [[False, True, None], []]


def test_open_writes_on_all_addresses_are_refused_under_plain_uvicorn(tmp_path, assets):
    ws = tmp_path / "open"
    spec = {"name": "anon", "config": {"model_name_or_path": "m", "dataset": "d", "template": "qwen"}}
    server = Uvicorn(ws, "0.0.0.0")
    try:
        r = server.api.get("/api/health")
        assert r.status_code == 503 and "TUNEDECK_OPEN_WRITE" in r.json()["detail"]
        assert server.api.post("/api/jobs", json=spec).status_code == 503
        if (addr := non_loopback_address()) is not None:  # from the network, too
            r = httpx.post(f"http://{addr}:{server.port}/api/jobs", json=spec, headers={"X-Tunedeck": "1"})
            assert r.status_code == 503
    finally:
        log = server.stop()
    assert "refusing every request" in log
    with sqlite3.connect(ws / "tunedeck.db") as db:
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0

    # The same bind with writes closed serves, and wants a token to write and, TUNEDECK_HOST being
    # left at its loopback default, to read as well: the bind is what counts.
    server = Uvicorn(tmp_path / "closed", "0.0.0.0", TUNEDECK_OPEN_WRITE="false")
    try:
        assert server.api.get("/api/health").status_code == 200
        assert server.api.post("/api/jobs", json=spec).status_code == 401
        assert server.api.get("/api/jobs").status_code == 401
    finally:
        server.stop()
    # Loopback with open writes is the default set-up: it serves.
    server = Uvicorn(
        tmp_path / "loopback",
        "127.0.0.1",
        TUNEDECK_LAUNCH_PAUSED="true",
        TUNEDECK_ALLOWED_ROOTS=f'["{assets}"]',
    )
    try:
        assert server.api.get("/api/health").status_code == 200
        assert (
            server.api.post("/api/jobs", json={"name": "x", "config": {}}).status_code == 422
        )  # reached the route
    finally:
        server.stop()


def test_query_tokens_only_on_the_stream_and_never_in_the_log(tmp_path):
    ws = tmp_path / "ws"
    viewer = token(ws, "wall", "viewer")
    server = Uvicorn(ws, "127.0.0.1", TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false")
    try:
        assert server.api.get("/api/jobs", headers=bearer(viewer)).status_code == 200
        assert server.api.get("/api/jobs", params={"access_token": viewer}).status_code == 401
        with server.api.stream("GET", "/api/stream", params={"access_token": viewer}) as r:
            assert r.status_code == 200
    finally:
        log = server.stop()
    assert "/api/stream?access_token=[redacted]" in log
    assert "/api/jobs?access_token=[redacted]" in log
    assert viewer not in log and viewer.removeprefix("tdk_") not in log

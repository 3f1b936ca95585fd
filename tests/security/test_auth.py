"""Tokens and roles: who may read, launch and cancel; closed writes off loopback; body limits."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from tests.conftest import Server, demo_config
from tests.utils.factories import create_token


def cli(workspace, *args: str) -> subprocess.CompletedProcess:  # noqa: ANN001
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(workspace)}
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", *args], env=env, capture_output=True, text=True
    )


def token(workspace, name: str, role: str) -> str:  # noqa: ANN001
    r = cli(workspace, "token", "create", "--name", name, "--role", role)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def bearer(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


def test_roles_and_ownership(app_factory, assets, tmp_path):
    ws = tmp_path / "ws"
    alice = token(ws, "alice", "submitter")
    assert cli(ws, "token", "create", "--name", "alice").returncode == 2  # one active token per name
    listing = cli(ws, "token", "list").stdout
    assert "alice" in listing and alice not in listing  # values are never shown again

    server = app_factory(
        TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true"
    )
    bob = create_token(server.engine, "bob", "submitter")
    viewer, admin = (
        create_token(server.engine, "wall", "viewer"),
        create_token(server.engine, "root", "admin"),
    )
    api = server.api
    spec = {"name": "held", "config": demo_config(assets), "gpus": 0}
    assert api.get("/api/jobs").status_code == 401
    assert api.get("/api/jobs", headers=bearer("tdk_forged")).status_code == 401
    assert api.get("/api/jobs", headers=bearer(viewer)).status_code == 200
    assert api.get("/api/health").status_code == 200  # liveness stays open
    assert api.post("/api/jobs", json=spec).status_code == 401
    assert api.post("/api/jobs", json=spec, headers=bearer(viewer)).status_code == 403

    r = api.post("/api/jobs", json=spec, headers=bearer(alice))
    assert r.status_code == 201 and r.json()["owner"] == "alice"
    job_id = r.json()["id"]
    assert api.post(f"/api/jobs/{job_id}/cancel", headers=bearer(bob)).status_code == 403
    # A person's token cannot pose as the job's runner.
    batch = {"seq": 0, "metrics": [{"line": 0, "t": 1.0, "raw": "{}"}]}
    assert api.post(f"/api/jobs/{job_id}/telemetry", json=batch, headers=bearer(admin)).status_code == 401
    assert api.get(f"/api/jobs/{job_id}/metrics", headers=bearer(admin)).json()["points"] == []
    r = api.post(f"/api/jobs/{job_id}/cancel", headers=bearer(admin))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"

    r = api.post("/api/jobs", json=spec, headers=bearer(bob))
    assert api.post(f"/api/jobs/{r.json()['id']}/cancel", headers=bearer(bob)).status_code == 200
    # EventSource cannot send headers: the stream, and only the stream, takes the token in the query.
    with api.stream("GET", "/api/stream", params={"access_token": viewer}) as r:
        assert r.status_code == 200
    assert api.get("/api/jobs", params={"access_token": viewer}).status_code == 401
    assert api.post("/api/jobs", params={"access_token": alice}, json=spec).status_code == 401

    assert cli(ws, "token", "revoke", "alice").returncode == 0
    assert api.get("/api/jobs", headers=bearer(alice)).status_code == 401


def test_open_writes_only_on_loopback(tmp_path, assets):
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(tmp_path / "ws")}
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", "serve", "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "TUNEDECK_OPEN_WRITE" in r.stderr
    server = Server(tmp_path / "ws2", assets, TUNEDECK_HOST="0.0.0.0", TUNEDECK_OPEN_WRITE="false")
    try:
        server.start()
        assert server.api.post("/api/jobs", json={}).status_code == 401
    finally:
        server.stop()


def test_body_limits(server_factory):
    server = server_factory(TUNEDECK_MAX_BODY_BYTES="65536")
    big = {"name": "big", "config": {"x": "a" * 70000}}
    assert server.api.post("/api/jobs", json=big).status_code == 413

    def chunks():  # no Content-Length: the limit holds while the body streams
        for _ in range(20):
            yield b"a" * 8192

    r = httpx.post(
        f"{server.url}/api/jobs/yaml?name=x",
        content=chunks(),
        headers={"content-type": "application/yaml", "X-Tunedeck": "1"},
    )
    assert r.status_code == 413
    deep = "[" * 5000 + "]" * 5000
    r = server.api.post("/api/jobs", content=deep, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422)  # refused as unparseable, not a crash
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    r = server.api.post(
        "/api/jobs/yaml", params={"name": "bomb"}, content=bomb, headers={"content-type": "application/yaml"}
    )
    assert r.status_code == 422 and "aliases" in r.json()["detail"][0]["msg"]
    r = server.api.post("/api/jobs", json={"name": "../../etc", "config": {}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    r = server.api.post("/api/jobs", json={"name": "x", "config": {}, "owner": "mallory"})
    assert r.status_code == 422  # unknown fields are refused, not ignored
    assert server.api.get("/api/jobs").json()["jobs"] == []

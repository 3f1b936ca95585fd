"""Tokens and roles: who may read, launch and cancel; closed writes off loopback; body limits."""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import text
from sqlmodel import Session
from starlette.requests import Request

from tests.utils.factories import create_job, create_token, post_telemetry
from tests.utils.servers import Server, demo_config
from tunedeck.api import auth, guard
from tunedeck.api.auth import AuthError, Principal, Role
from tunedeck.cli import main as tunedeck_cli
from tunedeck.config import Settings
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.hashes import token_hash


def cli(workspace, *args: str) -> subprocess.CompletedProcess:  # noqa: ANN001
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(workspace)}
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", *args], env=env, capture_output=True, text=True
    )


def token(workspace, name: str, role: str) -> str:  # noqa: ANN001
    r = cli(workspace, "token", "create", "--name", name, "--role", role)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def bearer(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """One migrated SQLite file for the unit tests below; each uses its own token names."""
    e = make_engine(tmp_path_factory.mktemp("auth") / "tunedeck.db")
    upgrade(e)
    yield e
    e.dispose()


def request(method: str, path: str, *, query: str = "", authorization: str | None = None) -> Request:
    """A request as Starlette hands it to the middleware."""
    headers = [(b"authorization", authorization.encode())] if authorization is not None else []
    return Request(
        {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": headers}
    )


def who(req: Request, settings: Settings, engine) -> Principal | None:  # noqa: ANN001
    # On a thread of its own: the suite's Playwright session keeps an event loop on the main thread,
    # where asyncio.run refuses to start another.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, auth.principal_for(req, settings, engine)).result()


def refused(req: Request, settings: Settings, engine) -> tuple[int, str]:  # noqa: ANN001
    with pytest.raises(AuthError) as e:
        who(req, settings, engine)
    return e.value.status, str(e.value)


def test_roles_are_ordered_viewer_submitter_admin():
    assert Role.viewer.rank < Role.submitter.rank < Role.admin.rank


def test_token_names_values_and_revocation(engine):
    with Session(engine) as s:
        for bad in ("", "-lead", "a b", "a/b", "x" * 65, "é"):
            with pytest.raises(ValueError, match="name"):
                auth.create_token(s, name=bad, role=Role.viewer)
        longest = auth.create_token(s, name="n" * 64, role=Role.viewer)
        value = auth.create_token(s, name="carol.b@team-1_x", role=Role.submitter)
        with pytest.raises(ValueError, match="active token named"):
            auth.create_token(s, name="carol.b@team-1_x", role=Role.admin)
        assert value.startswith("tdk_") and len(value) > 40
        stored = {t.name: t.token_hash for t in auth.list_tokens(s)}
        assert stored["carol.b@team-1_x"] == token_hash(value) != value
    assert auth.authenticate(engine, longest) == Principal("n" * 64, Role.viewer)
    assert auth.authenticate(engine, value) == Principal("carol.b@team-1_x", Role.submitter)
    assert auth.authenticate(engine, value + "x") is None
    with Session(engine) as s:
        assert auth.revoke_token(s, name="carol.b@team-1_x") == 1
        assert auth.revoke_token(s, name="carol.b@team-1_x") == 0
        again = auth.create_token(s, name="carol.b@team-1_x", role=Role.viewer)  # the name is free again
    assert auth.authenticate(engine, value) is None
    assert auth.authenticate(engine, again) == Principal("carol.b@team-1_x", Role.viewer)


def test_the_first_admin_token_is_written_once_and_never_revived(tmp_path):
    engine = make_engine(tmp_path / "tunedeck.db")
    upgrade(engine)
    create_token(engine, "admin", "submitter")  # the usual name is taken, by someone else
    path = tmp_path / "secret" / "admin_token"
    assert "created an admin token" in auth.ensure_admin(engine, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    assert auth.authenticate(engine, token) == Principal("admin-2", Role.admin)
    assert auth.ensure_admin(engine, path) is None  # an admin is active: nothing to do
    with Session(engine) as s:
        auth.revoke_token(s, name="admin-2")
    assert "not registered again" in auth.ensure_admin(engine, path)
    assert auth.authenticate(engine, token) is None
    short = tmp_path / "short"
    short.write_text("x" * 19 + "\n")
    with pytest.raises(RuntimeError, match="19 characters"):
        auth.ensure_admin(engine, short)
    chosen = tmp_path / "chosen"
    chosen.write_text("y" * 20 + "\n")  # 20 characters is enough
    assert "registered the admin token" in auth.ensure_admin(engine, chosen)
    assert auth.authenticate(engine, "y" * 20) == Principal("admin-2", Role.admin)
    engine.dispose()


def test_a_link_in_place_of_the_admin_token_file_is_not_followed(tmp_path):
    """Whoever can write next to the token file must not get the new admin token written elsewhere."""
    engine = make_engine(tmp_path / "tunedeck.db")
    upgrade(engine)
    path, elsewhere = tmp_path / "admin_token", tmp_path / "shared" / "stolen"
    elsewhere.parent.mkdir()
    path.symlink_to(elsewhere)  # a link to a file that does not exist yet
    with pytest.raises(FileExistsError):
        auth.ensure_admin(engine, path)
    assert not elsewhere.exists()
    path.unlink()  # in a folder that exists already
    assert "created an admin token" in auth.ensure_admin(engine, path)
    assert auth.authenticate(engine, path.read_text().strip()) == Principal("admin", Role.admin)
    engine.dispose()


@pytest.mark.parametrize(
    "host, safe",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("::", False),
        ("box.example.org", False),
    ],
)
def test_open_writes_are_refused_off_loopback(host, safe):
    why = auth.writes_are_safe(Settings(host=host, open_write=True))
    assert (why is None) == safe, why
    if not safe:
        assert host in why and "TUNEDECK_OPEN_WRITE=false" in why
    assert auth.writes_are_safe(Settings(host=host, open_write=False)) is None


@pytest.mark.parametrize(
    "host, given, is_open, warned",
    [
        ("127.0.0.1", None, True, False),  # the default set-up: a page on the same machine
        ("::1", None, True, False),
        ("0.0.0.0", None, False, False),  # the README's team block: reads closed with writes
        ("10.1.2.3", None, False, False),
        ("0.0.0.0", "true", True, True),  # opened on purpose, and said loudly
        ("box.example.org", "true", True, True),
        ("127.0.0.1", "true", True, False),
        ("127.0.0.1", "false", False, False),
        ("0.0.0.0", "false", False, False),
    ],
)
def test_reads_off_loopback_need_a_token_unless_opened_explicitly(
    host, given, is_open, warned, engine, monkeypatch
):
    # As `tunedeck serve` reads it: from the environment, `--host` given on top (cli._settings).
    monkeypatch.setenv("TUNEDECK_OPEN_WRITE", "false")
    if given is not None:
        monkeypatch.setenv("TUNEDECK_OPEN_READ", given)
    monkeypatch.setattr(tunedeck_cli, "get_settings", Settings)
    settings = tunedeck_cli._settings(host=host)
    assert auth.reads_open(settings) == is_open
    assert (guard.reads_warning(settings) is not None) == warned
    if is_open:
        assert who(request("GET", "/api/jobs/1/archive"), settings, engine) is None
    else:
        assert refused(request("GET", "/api/jobs/1/archive"), settings, engine)[0] == 401
    # Listening off loopback whatever TUNEDECK_HOST says (plain uvicorn) closes reads left unset.
    assert auth.reads_open(settings, exposed=True) == (is_open and given is not None)


def test_the_guard_by_route_method_and_role(engine):
    closed = Settings(open_read=False, open_write=False)
    tokens = {r: create_token(engine, f"guard-{r}", r) for r in ("viewer", "submitter", "admin")}
    bearer_of = {r: f"Bearer {t}" for r, t in tokens.items()}
    assert refused(request("GET", "/api/jobs"), closed, engine)[0] == 401
    assert refused(request("GET", "/metrics"), closed, engine)[0] == 401
    for method in ("GET", "HEAD", "OPTIONS"):
        got = who(request(method, "/api/jobs", authorization=bearer_of["viewer"]), closed, engine)
        assert got == Principal("guard-viewer", Role.viewer)
    assert who(request("GET", "/api/jobs", authorization="bearer " + tokens["viewer"]), closed, engine)
    assert (
        refused(request("GET", "/api/jobs", authorization="Basic " + tokens["admin"]), closed, engine)[0]
        == 401
    )
    assert refused(request("GET", "/api/jobs", authorization="Bearer tdk_forged"), closed, engine) == (
        401,
        "invalid or revoked token",
    )
    # Outside the API (pages, assets) and the exempt routes answer anyone; a runner's own token is
    # checked by its route, never looked up among people's tokens.
    assert who(request("GET", "/"), closed, engine) is None
    assert who(request("GET", "/api/health"), closed, engine) is None
    assert (
        who(request("POST", "/api/jobs/7/telemetry", authorization="Bearer runner"), closed, engine) is None
    )
    assert refused(request("GET", "/api/health/x"), closed, engine)[0] == 401
    # Who is asking answers a stranger (the page must learn to sign in), still checks a token sent, and
    # opens nothing beside it.
    assert who(request("GET", "/api/me"), closed, engine) is None
    assert who(request("GET", "/api/me", authorization=bearer_of["viewer"]), closed, engine) == Principal(
        "guard-viewer", Role.viewer
    )
    assert refused(request("GET", "/api/me", authorization="Bearer tdk_forged"), closed, engine)[0] == 401
    assert refused(request("GET", "/api/me/x"), closed, engine)[0] == 401
    assert refused(request("POST", "/api/me"), closed, engine)[0] == 401
    # Writes: no token 401, a viewer 403, a submitter or an admin passes.
    assert refused(request("POST", "/api/jobs"), closed, engine)[0] == 401
    status, msg = refused(request("POST", "/api/jobs", authorization=bearer_of["viewer"]), closed, engine)
    assert status == 403 and "viewer" in msg
    for role in ("submitter", "admin"):
        got = who(request("POST", "/api/jobs/3/cancel", authorization=bearer_of[role]), closed, engine)
        assert got == Principal(f"guard-{role}", Role(role))
    # Asking without changing anything is reading.
    assert who(request("POST", "/api/lint", authorization=bearer_of["viewer"]), closed, engine)
    assert refused(request("POST", "/api/lint"), closed, engine)[0] == 401
    assert (
        refused(request("POST", "/api/lint/x", authorization=bearer_of["viewer"]), closed, engine)[0] == 403
    )
    # The stream alone takes the token in the query (EventSource sends no headers), and only on GET.
    q = f"access_token={tokens['viewer']}"
    assert who(request("GET", "/api/stream", query=q), closed, engine) == Principal(
        "guard-viewer", Role.viewer
    )
    assert refused(request("GET", "/api/jobs", query=q), closed, engine)[0] == 401
    assert refused(request("POST", "/api/stream", query=q), closed, engine)[0] == 401


def test_open_settings_let_anyone_through_but_still_check_a_given_token(engine):
    open_ = Settings(open_read=True, open_write=True)
    assert who(request("GET", "/api/jobs"), open_, engine) is None
    assert who(request("POST", "/api/jobs"), open_, engine) is None
    assert refused(request("POST", "/api/jobs", authorization="Bearer tdk_forged"), open_, engine)[0] == 401
    reads_open = Settings(open_read=True, open_write=False)
    assert who(request("GET", "/api/jobs"), reads_open, engine) is None
    assert refused(request("POST", "/api/jobs"), reads_open, engine)[0] == 401


def test_who_may_cancel_a_job():
    open_, closed = Settings(open_write=True), Settings(open_write=False)
    alice, bob = Principal("alice", Role.submitter), Principal("bob", Role.submitter)
    assert auth.may_cancel(None, "alice", open_) and not auth.may_cancel(None, "alice", closed)
    assert auth.may_cancel(alice, "alice", closed) and not auth.may_cancel(bob, "alice", closed)
    assert not auth.may_cancel(alice, "bob", closed)
    assert not auth.may_cancel(bob, "alice", open_)  # open writes do not let a teammate cancel by token
    assert auth.may_cancel(bob, None, open_) and not auth.may_cancel(bob, None, closed)  # nobody's job
    assert auth.may_cancel(Principal("root", Role.admin), "alice", closed)
    assert not auth.may_cancel(Principal("alice", Role.viewer), "alice", closed)


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
        [sys.executable, "-m", "tunedeck.cli.main", "serve", "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "TUNEDECK_OPEN_WRITE" in r.stderr
    server = Server(tmp_path / "ws2", assets, TUNEDECK_OPEN_WRITE="false")
    server.command += ["--host", "0.0.0.0"]
    try:
        server.start()
        assert server.api.post("/api/jobs", json={}).status_code == 401
        r = server.api.get("/api/jobs")  # reads off loopback want a token too (TUNEDECK_OPEN_READ unset)
        assert r.status_code == 401 and "off loopback" in r.json()["detail"]
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


def test_a_token_per_rank_each_writes_its_jobs_telemetry_and_no_hash_does(app_factory, assets):
    """On Ray each rank's actor makes its runner's token and the server keeps one hash per rank, the
    one made at launch no longer counting (scheduling/executors/ray/actor.py): each rank's token is taken; the
    old one, a hash (all that crossed Ray) or the stored column are refused."""
    app = app_factory()
    job = create_job(app.engine, app.settings, config=demo_config(assets), runner_token="the scheduler's")
    ranks = [secrets.token_urlsafe(32) for _ in range(2)]
    stored = " ".join(token_hash(t) for t in ranks)
    with app.engine.begin() as conn:  # what the Ray executor's admit() writes before any runner starts
        conn.execute(
            text("UPDATE jobs SET runner_token_hash = :h WHERE id = :id"), {"h": stored, "id": job.id}
        )
    for seq, tok in enumerate(ranks):
        assert (
            post_telemetry(app.api, job.id, tok, seq=seq, start_line=seq, logs=[f"rank {seq}"]).status_code
            == 200
        )
    for wrong in ("the scheduler's", token_hash(ranks[0]), stored, ""):
        assert post_telemetry(app.api, job.id, wrong, seq=5, logs=["forged"]).status_code == 401, wrong
    assert [g["text"] for g in app.api.get(f"/api/jobs/{job.id}/logs").json()["lines"]] == [
        "rank 0",
        "rank 1",
    ]

"""The live stream: a client that disconnects mid-run and resumes with Last-Event-ID holds every
point and every log line exactly once, and the run never notices the browsers."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from tests.sseclient import events
from tests.utils.servers import demo_config
from tests.utils.wait import until

pytestmark = pytest.mark.slow
FINISHED = ("succeeded", "failed", "cancelled")


def read(server, job_id: int, *, last_id: str | None, until) -> tuple[dict, str | None]:
    """Read the job stream into per-kind id lists until `until(got)` holds; returns them and the last id."""
    got: dict[str, list] = {"metrics": [], "logs": [], "memory": [], "alerts": [], "job": []}
    headers = {"Last-Event-ID": last_id} if last_id else {}
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("GET", "/api/stream", params={"job": job_id}, headers=headers) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for ev in events(r):
            last_id = ev["id"]
            if ev["event"] == "job":
                got["job"].append(ev["data"])
            else:
                got[ev["event"]] += [row["id"] for row in ev["data"]]
            if until(got):
                break
    return got, last_id


def test_resume_with_last_event_id_gets_everything_once(server_factory, assets):
    server = server_factory()
    job = server.submit(
        {
            "name": "stream",
            "config": demo_config(assets, max_steps=60, logging_steps=1, eval_steps=20, save_steps=60),
            "gpus": 0,
        }
    )
    # First visit: leave as soon as some points have arrived, mid-run.
    first, cursor = read(server, job["id"], last_id=None, until=lambda g: len(g["metrics"]) >= 3)
    assert first["job"][0]["id"] == job["id"] and cursor.startswith("m")
    # While nobody watches, the run goes on.
    until(
        lambda: len(server.all(job["id"], "metrics")) > len(first["metrics"]) + 5,
        "progress of the run while no client watched",
        timeout=240,
        interval=0.5,
    )
    # Come back with Last-Event-ID, as EventSource does, and stay until the job has ended.
    second, _ = read(
        server, job["id"], last_id=cursor, until=lambda g: any(j["status"] in FINISHED for j in g["job"])
    )
    final = second["job"][-1]
    assert final["status"] == "succeeded", final

    metric_ids = [p["id"] for p in server.all(job["id"], "metrics")]
    log_ids = [g["id"] for g in server.all(job["id"], "logs")]
    assert first["metrics"] + second["metrics"] == metric_ids  # every point, once, in order
    assert first["logs"] + second["logs"] == log_ids
    mem_ids = first["memory"] + second["memory"]
    assert len(mem_ids) == len(set(mem_ids)) and mem_ids == sorted(mem_ids)
    assert final["last_loss"] is not None and final["progress"]["current_steps"] == 60


def test_team_stream_and_cursors(server_factory, assets):
    server = server_factory()
    r = server.api.get("/api/stream", params={"cursor": "nonsense"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cursor"]
    assert server.api.get("/api/stream", params={"job": 999}).status_code == 404
    job = server.submit(
        {"name": "team", "config": demo_config(assets, max_steps=4, logging_steps=1), "gpus": 0}
    )
    seen: list[str] = []
    with httpx.Client(base_url=server.url, timeout=120) as client, client.stream("GET", "/api/stream") as r:
        for ev in events(r):
            assert ev["event"] == "jobs"
            seen += [j["status"] for j in ev["data"] if j["id"] == job["id"]]
            if seen and seen[-1] in FINISHED:
                cursor = ev["id"]
                break
    assert seen[0] == "queued" or seen[0] == "running"
    assert "running" in seen and seen[-1] == "succeeded"
    # A client already up to date hears nothing new about a finished job; the cursor endpoint agrees.
    now = server.api.get("/api/stream/cursor").json()["cursor"]
    assert now.startswith("m") and int(now.split("-")[0][1:]) == server.all(job["id"], "metrics")[-1]["id"]
    assert int(cursor.rsplit("-j", 1)[1]) > 0
    # A new alert changes the job's row on the team page (its badge) without changing the job.
    with sqlite3.connect(server.workspace / "tunedeck.db") as con:
        con.execute(
            "INSERT INTO alerts (job_id, kind, severity, gpu, t, step, message, suggestion, open, first_t,"
            " last_t, count) VALUES (?, 'test', 'warning', NULL, 1, 1, 'm', 's', 0, 1, 1, 1)",
            (job["id"],),
        )
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("GET", "/api/stream", headers={"Last-Event-ID": cursor}) as r,
    ):
        ev = next(events(r))
    assert [j["id"] for j in ev["data"]] == [job["id"]] and ev["id"] != cursor

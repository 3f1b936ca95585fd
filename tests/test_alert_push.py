"""A new alert reaches an open job page as soon as the alert engine stores it: the engine wakes the
streams itself, so neither the stream watcher's poll nor a keep-alive (an hour apart here) is on the way."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from contextlib import closing

import httpx

from tests.sseclient import events
from tests.utils.servers import demo_config
from tests.utils.wait import until

GiB = 1024**3
TOKEN = "runner-secret"


def columns(first: int, used: list[float]) -> dict:
    lines = list(range(first, first + len(used)))
    return {
        "line": lines,
        "t": [1_800_000_000.0 + i for i in lines],
        "gpu": [0] * len(used),
        "used_bytes": [int(u) for u in used],
        "total_bytes": [192 * GiB] * len(used),
    }


def paused_job(server_factory, assets, name: str):
    """A server whose streams wake only when pushed (poll and keep-alive an hour apart), one job on it
    that never launches, and `post(seq, memory)` sending that job's telemetry as its runner would."""
    server = server_factory(
        TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_STREAM_POLL_S="3600", TUNEDECK_STREAM_PING_S="3600"
    )
    job = server.submit({"name": name, "config": demo_config(assets), "gpus": 0})["id"]
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db, db:
        db.execute(  # the runner's token, and the GPU its samples name (a runner reports its job's devices)
            "UPDATE jobs SET runner_token_hash = ?, gpus = 1 WHERE id = ?",
            (hashlib.sha256(TOKEN.encode()).hexdigest(), job),
        )
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def post(seq: int, memory: dict) -> None:
        body = json.dumps({"seq": seq, "memory": memory})
        r = server.api.post(f"/api/jobs/{job}/telemetry", content=body, headers=headers)
        assert r.status_code == 200, r.text

    return server, job, post


def test_a_new_alert_is_pushed_without_the_watcher(server_factory, assets):
    server, job, post = paused_job(server_factory, assets, "push")
    base = [50 * GiB + (i % 7) * 0.01 * GiB for i in range(102)]
    post(0, columns(0, base[:100]))
    seen: dict[str, list] = {"memory": [], "alerts": []}

    def follow() -> None:
        with (
            httpx.Client(base_url=server.url, timeout=180) as client,
            client.stream("GET", "/api/stream", params={"job": job}) as r,
        ):
            for ev in events(r):
                if ev["event"] in seen:
                    seen[ev["event"]] += ev["data"]
                if any(a["kind"] == "vram_spike" for a in seen["alerts"]):
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    # The page has caught up with what is stored.
    until(lambda: len(seen["memory"]) >= 100, "the stream's replay of the stored samples", interval=0.05)
    assert not [a for a in seen["alerts"] if a["kind"] == "vram_spike"]
    base[100] += 30 * GiB  # one sample up, the next back down: a spike
    post(1, columns(100, base[100:]))
    reader.join(timeout=120)
    (alert,) = [a for a in seen["alerts"] if a["kind"] == "vram_spike"]
    assert alert["gpu"] == 0 and alert["t"] == 1_800_000_100.0
    # The stream's row is the alert list's row (less the job id the stream is for): same fields, same types.
    (listed,) = [a for a in server.api.get(f"/api/jobs/{job}/alerts").json() if a["id"] == alert["id"]]
    assert set(alert) == set(listed) - {"job_id"}
    for k in ("kind", "gpu", "t", "first_t", "open", "change", "suggestion", "node"):
        assert alert[k] == listed[k] and type(alert[k]) is type(listed[k]), k
    assert isinstance(alert["open"], bool)  # not the table's 0 or 1


def test_an_open_job_page_shows_a_new_alert_from_the_stream_alone(server_factory, assets, page):
    """The page draws the alert the stream sends: no request for the alert list on the way (here
    every such request fails once the page is ready)."""
    server, job, post = paused_job(server_factory, assets, "push-page")
    base = [50 * GiB + (i % 7) * 0.01 * GiB for i in range(102)]
    post(0, columns(0, base[:100]))
    page.goto(f"{server.url}/jobs/{job}")
    page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
    page.wait_for_function("window.tunedeck.mem.get('/0')?.y.length >= 100", timeout=120_000)
    assert page.locator('#alerts .alert-item[data-kind="vram_spike"]').count() == 0
    page.route("**/api/jobs/*/alerts*", lambda route: route.abort())
    base[100] += 30 * GiB  # one sample up, the next back down (the job is queued: not alerted as it rises)
    post(1, columns(100, base[100:]))
    item = page.locator('#alerts .alert-item[data-kind="vram_spike"]')
    item.wait_for(timeout=120_000)
    assert "+30.0 GiB above" in item.inner_text()
    assert not page.errors

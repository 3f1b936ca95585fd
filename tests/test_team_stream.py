"""The team stream at a cluster's pace: every batch of every job changes its row, and the team
streams wake at most once every `stream_team_every_s`, so a burst of batches goes out as a few
`jobs` events, the last with the row as the burst left it. Each event is encoded once, whatever
the number of streams that send it."""

from __future__ import annotations

import json
import os
import secrets
import threading
from concurrent.futures import Future

import httpx

from tests.sseclient import events, strict
from tests.utils.servers import demo_config
from tests.utils.wait import DEADLINE, until
from tunedeck import procs
from tunedeck.services.jobs.jobstate import JobState, move
from tunedeck.services.live import feed
from tunedeck.store.db import make_engine
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import JobStatus

BURST = 50


def loss(step: int) -> float:
    return 3.0 - step / 100


def test_a_burst_of_batches_is_a_few_team_events_the_last_with_the_final_row(server_factory, assets):
    # Five seconds apart: the burst's 50 batches fit in a few intervals on any machine.
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_STREAM_TEAM_EVERY_S="5")
    job = server.submit({"name": "burst", "config": demo_config(assets), "gpus": 0})["id"]
    # This test plays the job's runner, as the scheduler records one it launched.
    token = secrets.token_urlsafe(16)
    engine = make_engine(server.workspace / "tunedeck.db")
    with JobState(engine).begin() as conn:
        move(
            conn,
            job,
            JobStatus.running,
            runner_token_hash=token_hash(token),
            runner_pid=os.getpid(),
            runner_started=procs.create_time(os.getpid()),
        )

    ready, rows = threading.Event(), []
    final: Future = Future()

    def watch() -> None:  # the team page: the job's rows from every `jobs` event after `ready`
        try:
            with (
                httpx.Client(base_url=server.url, timeout=DEADLINE) as client,
                client.stream("GET", "/api/stream") as r,
            ):
                for ev in events(r):
                    mine = [j for j in ev["data"] if j["id"] == job]
                    if ready.is_set() and mine:
                        rows.append(mine[0])
                        if (mine[0]["progress"]["current_steps"] or 0) == BURST:
                            final.set_result(mine[0])
                            return
                    if mine and mine[0]["status"] == "running":
                        ready.set()
        except BaseException as e:
            final.set_exception(e)

    threading.Thread(target=watch, daemon=True).start()
    until(ready.is_set, "the running job on the team stream")
    for step in range(1, BURST + 1):  # one batch at a time, each stored before the next
        point = {"current_steps": step, "total_steps": 1000, "loss": loss(step)}
        r = server.api.post(
            f"/api/jobs/{job}/telemetry",
            json={"seq": step, "metrics": [{"line": step, "t": 1.8e9 + step, "raw": json.dumps(point)}]},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
    last = final.result(timeout=DEADLINE)
    assert last["last_loss"] == loss(BURST) and last["status"] == "running"
    assert len(rows) <= 10, [row["progress"]["current_steps"] for row in rows]  # a wake-up a batch: ~50

    # One encoding for every stream that sends an event: the bytes are made once and handed on.
    (ev,), _ = feed.team_events(engine, feed.Cursor(), limit=100)
    wire = ev.sse()
    assert ev.sse() is wire
    head, data = wire.decode().split("\r\ndata: ")
    assert head == f"id: {ev.id}\r\nevent: jobs" and strict(data)[0]["last_loss"] == loss(BURST)
    engine.dispose()

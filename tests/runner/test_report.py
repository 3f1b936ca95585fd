"""The runner's reporter against a real server: batches that queue up go together, a refused one
is found and set aside, and every good item is stored once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3

from tests.utils.servers import demo_config
from tests.utils.wait import until
from tunedeck.runner.report import Reporter, merge


def test_merge_keeps_every_item_and_numbers_as_the_last():
    a = {
        "seq": 3,
        "metrics": [{"line": 0}],
        "logs": [],
        "states": [],
        "memory": {"line": [0, 1], "t": [1.0, 1.0], "gpu": [0, 1], "used_bytes": [5, 6], "name": ["A", "B"]},
    }
    b = {"seq": 4, "metrics": [], "logs": [{"line": 0}], "states": [{"event": "exited"}]}
    c = {
        "seq": 5,
        "metrics": [{"line": 1}],
        "logs": [],
        "states": [],
        "memory": {"line": [2], "t": [2.0], "gpu": [0], "used_bytes": [7], "util": [0.5]},
    }
    assert merge([a, b, c]) == {
        "seq": 5,
        "metrics": [{"line": 0}, {"line": 1}],
        "logs": [{"line": 0}],
        "states": [{"event": "exited"}],
        "memory": {
            "line": [0, 1, 2],
            "t": [1.0, 1.0, 2.0],
            "gpu": [0, 1, 0],
            "used_bytes": [5, 6, 7],
            "name": ["A", "B", None],
            "util": [None, None, 0.5],
        },
    }
    assert merge([a]) is a


def runner_token(server, job_id: int) -> str:
    token = "runner-secret"
    with sqlite3.connect(server.workspace / "tunedeck.db") as db:  # what the scheduler does at launch
        db.execute(
            "UPDATE jobs SET runner_token_hash=? WHERE id=?",
            (hashlib.sha256(token.encode()).hexdigest(), job_id),
        )
    return token


def scrape(server, name: str) -> float:
    for line in server.api.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_queued_batches_go_together_and_a_refused_one_alone(server_factory, assets, tmp_path):
    # Batch 25 is one the runner's model takes but the server refuses: larger than its body limit.
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_MAX_BODY_BYTES=str(32 * 1024))
    job = server.submit({"name": "reporter", "gpus": 0, "config": demo_config(assets)})
    token = runner_token(server, job["id"])
    reporter = Reporter(url=server.url, job_id=job["id"], token=token, run_dir=tmp_path, retry_max_s=1)
    good = [n for n in range(40) if n != 25]
    # The server is stopped while the batches are made: they all wait for one request to end.
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        for n in range(40):
            sample = {"line": n, "t": 1.0 + n, "gpu": -1, "used_bytes": 2**30 + n}  # a CPU job's host memory
            reporter.add(
                metrics=[{"line": n, "t": 1.0 + n, "raw": json.dumps({"current_steps": n + 1})}],
                logs=[{"line": 0, "t": 1.0, "stream": "stdout", "text": "x" * 60000}] if n == 25 else [],
                memory=[sample],
            )
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert reporter.drain(120), "batches left undelivered"
    reporter.close()
    assert [p["step"] for p in server.all(job["id"], "metrics")] == [n + 1 for n in good]
    mem = server.api.get(f"/api/jobs/{job['id']}/memory", params={"limit": 1000}).json()["samples"]
    assert [m["used_bytes"] for m in mem] == [2**30 + n for n in good]  # the refused batch alone is left out
    # Far fewer requests stored than batches made: the 39 good ones went in a handful.
    stored = until(lambda: scrape(server, "tunedeck_ingest_batches_total"), "ingest counter")
    assert stored <= 12, stored
    assert len((tmp_path / "outbox.jsonl").read_text().splitlines()) == 40  # each batch on disk first


def test_an_item_the_model_refuses_is_dropped_where_it_is_made(server_factory, assets, tmp_path):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    job = server.submit({"name": "reporter", "gpus": 0, "config": demo_config(assets)})
    token = runner_token(server, job["id"])
    said: list[str] = []
    reporter = Reporter(
        url=server.url, job_id=job["id"], token=token, run_dir=tmp_path, retry_max_s=1, say=said.append
    )
    step = {"line": 0, "t": 1.0, "raw": json.dumps({"current_steps": 1})}
    too_long = {"line": 1, "t": 1.0, "raw": "x" * 70000}
    samples = [{"line": n, "t": 1.0, "gpu": -1, "used_bytes": -1 if n == 1 else 2**30 + n} for n in range(3)]
    reporter.add(metrics=[step, too_long], memory=samples)
    reporter.add(logs=[{"line": 0, "t": float("nan"), "stream": "stdout", "text": "bad time"}])
    reporter.add(metrics=[{"line": 2, "t": 2.0, "raw": json.dumps({"current_steps": 2})}])
    assert reporter.drain(120), "batches left undelivered"
    reporter.close()
    sent = [json.loads(line) for line in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    # The bad metric and sample are gone from the first batch; the second had nothing else, so it is
    # not written at all and the numbering goes on without a gap.
    assert [b["seq"] for b in sent] == [0, 1]
    assert [m["line"] for m in sent[0]["metrics"]] == [0]
    assert sent[0]["memory"]["line"] == [0, 2]
    assert [p["step"] for p in server.all(job["id"], "metrics")] == [1, 2]
    mem = server.api.get(f"/api/jobs/{job['id']}/memory", params={"limit": 1000}).json()["samples"]
    assert [m["used_bytes"] for m in mem] == [2**30, 2**30 + 2]
    assert len(said) == 2 and "metrics.1.raw" in said[0] and "memory.used_bytes.1" in said[0], said
    assert "logs.0.t" in said[1], said

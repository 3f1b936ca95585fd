"""A real runner following trainer_log.jsonl: woken by inotify (or polling when told to), every line
delivered once, in order, to the API and the live stream."""

from __future__ import annotations

import json
import random
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from tests.sseclient import events
from tests.utils.servers import demo_config
from tests.utils.standin import release, training_env
from tests.utils.wait import until
from tunedeck.runner.report import columns
from tunedeck.runner.watch import FileWatch

NEVER = "3600"  # seconds: a timer this long never fires within a test


def test_watch_wakes_on_each_write_of_its_file(tmp_path):
    out = tmp_path / "output"
    out.mkdir()
    wake = threading.Event()
    watch = FileWatch(out, "trainer_log.jsonl", wake)
    try:
        assert watch.mode == "inotify" and watch.reason is None
        log = out / "trainer_log.jsonl"
        for i in range(3):
            wake.clear()
            with open(log, "a") as f:
                f.write(json.dumps({"current_steps": i}) + "\n")
            assert wake.wait(120), f"no wake-up for write {i}"
        # The folder going away ends the watch: the runner is told to poll from then on.
        wake.clear()
        shutil.rmtree(out)
        assert wake.wait(120)
        until(lambda: watch.mode == "poll", "fallback to polling")
        assert "removed" in watch.reason
    finally:
        watch.close()


def test_watch_falls_back_to_polling_and_says_why(tmp_path):
    wake = threading.Event()
    missing = FileWatch(tmp_path / "not-there", "trainer_log.jsonl", wake)
    assert missing.mode == "poll" and "inotify unavailable" in missing.reason
    assert "polling every 0.2s" in missing.describe(0.2)
    forced = FileWatch(tmp_path, "trainer_log.jsonl", wake, mode="poll")
    assert forced.mode == "poll" and "runner_watch = poll" in forced.reason
    missing.close()
    forced.close()


def test_memory_rows_go_as_columns():
    rows = [
        {"line": 0, "t": 1.0, "gpu": 0, "used_bytes": 5, "total_bytes": 9, "util": None, "name": "A"},
        {"line": 1, "t": 1.0, "gpu": 1, "used_bytes": 6, "total_bytes": 9, "util": None, "name": None},
    ]
    assert columns(rows) == {
        "line": [0, 1],
        "t": [1.0, 1.0],
        "gpu": [0, 1],
        "used_bytes": [5, 6],
        "total_bytes": [9, 9],
        "name": ["A", None],
    }


def append_in_bursts(log: Path, lines: list[str], rng: random.Random) -> None:
    """Many appends of 1 to 20 lines; some lines arrive in two writes, the way a buffered writer can
    split them."""
    i = 0
    while i < len(lines):
        burst = lines[i : i + rng.randint(1, 20)]
        text = "".join(x + "\n" for x in burst)
        cut = rng.randrange(len(text)) if rng.random() < 0.3 else len(text)
        for part in (text[:cut], text[cut:]):
            if part:
                with open(log, "a", encoding="utf-8") as f:
                    f.write(part)
        i += len(burst)


def stream_steps(server, job_id: int, want: int) -> list[int]:
    """The steps of every metric event of the job's stream from the start, until `want` arrived."""
    steps: list[int] = []
    with (
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=120)) as c,
        c.stream("GET", "/api/stream", params={"job": job_id}) as r,
    ):
        for ev in events(r):
            if ev["event"] == "metrics":
                steps += [p["step"] for p in ev["data"]]
            if len(steps) >= want:
                return steps
    return steps


@pytest.mark.parametrize("watch", ["auto", "poll"])
def test_runner_delivers_every_appended_line_once(server_factory, assets, tmp_path, watch):
    # Only the watch under test can deliver a line: the flush timer and the memory sampler never fire,
    # and a polling runner polls only in the poll case.
    server = server_factory(
        TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "train-env")),
        TUNEDECK_RUNNER_WATCH=watch,
        TUNEDECK_TELEMETRY_FLUSH_S=NEVER,
        TUNEDECK_MEMORY_SAMPLE_S=NEVER,
        TUNEDECK_RUNNER_POLL_S="0.05" if watch == "poll" else NEVER,
    )
    job = server.submit({"name": "held", "gpus": 0, "config": demo_config(assets)})  # runs until released
    until(lambda: server.api.get(f"/api/jobs/{job['id']}").json()["status"] == "running", "running job")
    out = Path(job["output_dir"])
    until(out.is_dir, "output folder made by the runner")
    n = 400
    lines = [
        json.dumps({"current_steps": s, "total_steps": n, "loss": 1.0 + 1 / s, "epoch": s / n})
        for s in range(1, n + 1)
    ]
    append_in_bursts(out / "trainer_log.jsonl", lines[:200], random.Random(watch))
    # The first half is delivered while the trainer still runs (the exit flush would hide a dead watch).
    until(
        lambda: (
            len(server.api.get(f"/api/jobs/{job['id']}/metrics", params={"limit": 1000}).json()["points"])
            >= 200
        ),
        "first half of the lines",
    )
    append_in_bursts(out / "trainer_log.jsonl", lines[200:], random.Random(watch + "2"))
    assert stream_steps(server, job["id"], n) == list(range(1, n + 1))
    points = server.all(job["id"], "metrics")
    assert [(p["step"], p["loss"]) for p in points] == [
        (s, 1.0 + 1 / s) for s in range(1, n + 1)
    ]  # whole lines

    release(Path(job["run_dir"]))
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=120)
    assert done["status"] == "succeeded", done
    assert [p["step"] for p in server.all(job["id"], "metrics")] == list(range(1, n + 1))  # nothing twice
    notes = [x["text"] for x in server.all(job["id"], "logs") if x["stream"] == "runner"]
    said = "with inotify" if watch == "auto" else "by polling every 0.05s (polling was asked for"
    assert any(said in t for t in notes), notes

"""The outbox reader of the files transport (services/ingest/outboxes.py) on a running job's run
folder, written here line by line as a runner appends: whole lines only (a torn one waits for the
rest), a line that is not a batch skipped and the rest still read, a file read again from its start
storing nothing twice; and stack dumps through the run folder, a report nobody asked for refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils.app import App
from tests.utils.factories import create_job, telemetry_batch
from tests.utils.servers import demo_config
from tests.utils.wait import until


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    a = App(
        tmp_path_factory.mktemp("outboxes") / "ws",
        assets,
        TUNEDECK_RUNNER_TRANSPORT="files",
        TUNEDECK_OUTBOX_POLL_S="0.1",
    ).start()
    yield a
    a.stop()


def line(seq: int, *steps: int) -> bytes:
    points = [{"current_steps": s, "total_steps": 100, "loss": 1.0 + s / 100} for s in steps]
    return (json.dumps(telemetry_batch(seq=seq, start_line=steps[0] - 1, points=points)) + "\n").encode()


def stored(app: App, job_id: int) -> list[int]:
    return [p["step"] for p in app.all(job_id, "metrics")]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_whole_lines_are_stored_once_and_a_torn_or_foreign_line_holds_nothing_up(app, assets):
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="offline", runner_token="r")
    outbox = Path(job.run_dir) / "outbox.jsonl"
    third = line(2, 5, 6)
    append(outbox, line(0, 1, 2) + line(1, 3, 4) + third[:25])  # the third still being written
    until(lambda: stored(app, job.id) == [1, 2, 3, 4], "the two whole lines")
    append(outbox, third[25:])
    until(lambda: stored(app, job.id) == [1, 2, 3, 4, 5, 6], "the torn line once it is whole")

    # The trainer can write the run folder too: what is not a batch is skipped, the next line read.
    refused = telemetry_batch(seq=3, start_line=6, points=[{"current_steps": 7}])
    refused["metrics"][0]["t"] = "soon"
    append(outbox, b"{not json\n" + (json.dumps(refused) + "\n").encode() + line(4, 8))
    until(lambda: stored(app, job.id)[-1:] == [8], "the line after two that are not batches")
    assert stored(app, job.id) == [1, 2, 3, 4, 5, 6, 8]

    # Another file under the name (rewritten, as after a copy): read from its start, nothing twice.
    fresh = outbox.with_name("outbox.new")
    fresh.write_bytes(line(0, 1, 2) + line(1, 3, 4) + line(5, 9))
    fresh.replace(outbox)
    until(lambda: stored(app, job.id)[-1:] == [9], "the new file's new line")
    assert stored(app, job.id) == [1, 2, 3, 4, 5, 6, 8, 9]

    # A rank's own outbox (a 2-node job's rank 1 sends output lines) is read beside rank 0's: not here,
    # where the job has one node.
    append(outbox.with_name("outbox.rank1.jsonl"), line(0, 50))
    append(outbox, line(6, 10))
    until(lambda: stored(app, job.id)[-1:] == [10], "rank 0's next line")
    assert 50 not in stored(app, job.id)


def test_stack_dumps_go_through_the_run_folder(app, assets):
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="hung", runner_token="r")
    folder = Path(job.run_dir)
    asked = app.api.post(f"/api/jobs/{job.id}/stacks")
    assert asked.status_code == 202, asked.text
    number = asked.json()["request"]
    until(
        lambda: (folder / "stacks.asked").exists() and (folder / "stacks.asked").read_text() == f"{number}\n",
        "the request in the run folder",
    )
    frames = [{"name": "all_reduce", "file": "/venv/torch/distributed/distributed_c10d.py", "line": 3}]
    report = {
        "request": number + 1,  # nobody asked for this one
        "node": "n1",
        "runner_rank": 0,
        "processes": [
            {"pid": 12, "rank": 0, "command": "python", "threads": [{"name": None, "frames": frames}]}
        ],
    }
    (folder / "stacks.json").write_text(json.dumps(report))
    (folder / "outbox.jsonl").write_bytes(line(0, 1))  # a pass that surely looked at the report
    until(lambda: stored(app, job.id) == [1], "a pass after the report")
    assert app.api.get(f"/api/jobs/{job.id}/stacks").json()["nodes"] == []
    assert not (app.settings.workspace / "stacks" / str(job.id) / str(number + 1)).exists()
    report["request"] = number
    (folder / ".stacks.json.tmp").write_text(json.dumps(report))
    (folder / ".stacks.json.tmp").replace(folder / "stacks.json")
    got = until(
        lambda: (d := app.api.get(f"/api/jobs/{job.id}/stacks").json())["nodes"] and d, "the report kept"
    )
    assert got["request"] == number and got["ranks"][0]["rank"] == 0 and "all_reduce" in got["summary"], got

"""API behaviour over rows made by our services (tests/utils/factories.py), the app in process:
the telemetry route as a runner uses it, and a job stream resumed from its cursor."""

from __future__ import annotations

import pytest

from tests.alerts.corpus import generate, write_run
from tests.sseclient import events
from tests.utils.factories import create_import, create_job, post_telemetry
from tests.utils.servers import demo_config

RUNNER = "runner-secret"


def step(k: int, total: int = 10) -> dict:
    return {
        "current_steps": k,
        "total_steps": total,
        "loss": 3.0 - k / 10,
        "percentage": 100 * k / total,
        "remaining_time": f"0:00:{10 * (total - k):02d}",
    }


def test_runner_batches_need_the_job_token_and_are_stored_once(app_factory, assets):
    app = app_factory()
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="fed", runner_token=RUNNER)
    other = create_job(
        app.engine, app.settings, config=demo_config(assets), name="other", runner_token="other"
    )
    first = {"seq": 0, "points": [step(1), step(2), step(3)], "logs": ["loading", "training"]}
    assert post_telemetry(app.api, job.id, "other", **first).status_code == 401  # another job's runner
    assert post_telemetry(app.api, job.id, "", **first).status_code == 401
    assert post_telemetry(app.api, 999, RUNNER, **first).status_code == 404
    for _ in range(3):  # a runner that resends after a lost answer: stored once
        r = post_telemetry(app.api, job.id, RUNNER, **first)
        assert r.status_code == 200 and r.json() == {"stored": 0}
    # A replayed older line does not move progress back; the exit ends the job.
    r = post_telemetry(
        app.api,
        job.id,
        RUNNER,
        seq=1,
        points=[step(1)],
        states=[{"event": "exited", "exit_code": 0, "cancelled": False}],
    )
    assert r.status_code == 200
    got = app.api.get(f"/api/jobs/{job.id}").json()
    assert got["status"] == "succeeded" and got["exit_code"] == 0
    assert got["progress"]["current_steps"] == 3 and got["progress"]["total_steps"] == 10
    points = app.all(job.id, "metrics")
    assert [p["step"] for p in points] == [1, 2, 3] and points[0]["loss"] == pytest.approx(2.9)
    assert [g["text"] for g in app.all(job.id, "logs")] == ["loading", "training"]
    assert (
        app.all(other.id, "metrics") == []
        and app.api.get(f"/api/jobs/{other.id}").json()["status"] == "running"
    )


def read_metrics(app, job_id: int, want: int, last_id: str | None = None) -> tuple[list[int], str]:
    """Metric ids from the job stream until `want` have arrived; returns them and the last event id."""
    ids: list[int] = []
    headers = {"Last-Event-ID": last_id} if last_id else {}
    with app.api.stream("GET", "/api/stream", params={"job": job_id}, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for ev in events(r):
            last_id = ev["id"]
            if ev["event"] == "metrics":
                ids += [row["id"] for row in ev["data"]]
            if len(ids) >= want:
                return ids, last_id
    raise AssertionError(f"the stream ended after {len(ids)} of {want} points")


@pytest.mark.timeout(300)
def test_job_stream_resumes_after_its_cursor_with_nothing_lost_or_repeated(app_factory, tmp_path):
    app = app_factory(TUNEDECK_STREAM_BATCH_MAX="40")  # a history of several events per kind
    trace = next(t for t in generate(2) if t.name.startswith("plateau"))
    job = create_import(app.engine, app.settings, write_run(trace, tmp_path / "corpus"), name="outside")
    every = [p["id"] for p in app.all(job.id, "metrics")]
    assert len(every) == len(trace.series.points) > 100
    first, cursor = read_metrics(app, job.id, want=100)  # leave mid-history
    assert 100 <= len(first) < len(every)
    rest, _ = read_metrics(app, job.id, want=len(every) - len(first), last_id=cursor)
    assert first + rest == every

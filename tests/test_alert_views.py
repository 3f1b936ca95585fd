"""What the team views are told about alerts, through the API of one app in process: the worst alert a
job ever had and whether its success is one to trust, no healthy plateau beside spikes, a CPU job's
memory named as host memory, advice that says what it changes and carries the change, a stuck loss,
and an alert that closes reaching open streams at once."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.alerts.corpus import generate, write_run
from tests.sseclient import events
from tests.utils.app import App
from tests.utils.factories import create_job, post_telemetry
from tests.utils.runs import decaying, imported, memory_csv
from tests.utils.servers import ROOT, demo_config
from tests.utils.wait import until
from tunedeck.schemas import JobOut
from tunedeck.services.live import feed

GiB = 1024**3


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    a = App(tmp_path_factory.mktemp("views") / "ws", assets, TUNEDECK_STREAM_PING_S="1").start()
    yield a
    a.stop()


def alerts(app: App, job_id: int) -> dict[str, dict]:
    return {a["kind"]: a for a in app.api.get(f"/api/jobs/{job_id}/alerts").json()}


def test_a_run_whose_loss_went_nan_is_a_success_with_problems(app):
    bad = imported(app.api, "went-nan", [2.5, 2.4, float("nan"), 18.0], "fp16: true\nlearning_rate: 1.0e-4\n")
    good = imported(app.api, "healthy", decaying())
    assert bad["status"] == "succeeded" and bad["verdict"] == "succeeded_with_problems"
    summary = {"worst": "critical", "counts": {"critical": 1}, "open": 0, "problems": ["loss_nan"]}
    assert bad["alerts"] == summary  # closed, since the run is over, and still shown
    assert good["verdict"] == "succeeded" and good["alerts"]["worst"] is None
    listed = {j["id"]: j for j in app.api.get("/api/jobs").json()["jobs"]}
    assert listed[bad["id"]]["alerts"] == summary and listed[good["id"]]["verdict"] == "succeeded"
    assert app.api.get(f"/api/jobs/{bad['id']}").json()["verdict"] == "succeeded_with_problems"
    (row,) = feed.job_rows(app.engine, [bad["id"]])  # what the team stream sends
    assert row["alerts"] == summary and row["verdict"] == "succeeded_with_problems"


def test_the_stream_rows_add_only_columns_the_pages_read(app):
    """Beyond JobOut (the alert badge reads its `alerts`), each key of a row is read by a page script."""
    job = imported(app.api, "columns", decaying())
    (row,) = feed.job_rows(app.engine, [job["id"]])
    extras = set(row) - set(JobOut.model_fields)
    scripts = "\n".join(p.read_text() for p in sorted((ROOT / "frontend/js").glob("*.js")))
    assert extras and sorted(k for k in extras if not re.search(rf"\.{k}\b", scripts)) == []


def test_the_worst_alert_is_the_worst_ever_and_info_stays_info(app):
    rng = np.random.default_rng(1)
    y = 40 * GiB + rng.normal(0, 0.05 * GiB, 237)  # as long as the loss log: no stall
    calm = imported(app.api, "calm", decaying(), memory=memory_csv(0, y, 192 * GiB))
    assert calm["alerts"]["worst"] == "info" and calm["alerts"]["counts"] == {"info": 1}
    assert calm["verdict"] == "succeeded"  # a plateau says nothing against the result
    y[150] += 30 * GiB
    spiky = imported(app.api, "spiky", decaying(), memory=memory_csv(0, y, 192 * GiB))
    assert spiky["alerts"]["worst"] == "warning" and spiky["alerts"]["counts"]["warning"] == 1


def test_past_problems_are_listed_team_wide_newest_first(app):
    imported(app.api, "nan-a", [2.0, float("nan")])
    last = imported(app.api, "nan-b", [2.0, float("inf")])
    got = app.api.get("/api/alerts", params={"open": "false", "min_severity": "critical", "order": "desc"})
    rows = got.json()
    assert got.status_code == 200 and rows[0]["job_id"] == last["id"]
    assert {a["severity"] for a in rows} == {"critical"} and not any(a["open"] for a in rows)
    assert [a["id"] for a in rows] == sorted((a["id"] for a in rows), reverse=True)
    for params, loc in (({"severty": "critical"}, "severty"), ({"min_severity": "fatal"}, "min_severity")):
        r = app.api.get("/api/alerts", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", loc], r.text


def test_no_healthy_plateau_beside_spikes_and_host_memory_is_named_so(app, tmp_path):
    periodic = next(t for t in generate(0) if t.name == "periodic-ga8-0")
    folder = write_run(periodic, tmp_path)
    files = {
        "trainer_log": (folder / "output" / "trainer_log.jsonl").read_bytes(),
        "memory": (folder / "memory.csv").read_bytes(),
        "config": (folder / "train.yaml").read_bytes(),
    }
    job = app.api.post("/api/runs/import", files=files, data={"name": "periodic"}).json()
    found = alerts(app, job["id"])
    assert "vram_periodic_spikes" in found and "vram_plateau" not in found
    # A CPU job: its series is the host's memory (-1), with a spike on a flat line.
    rng = np.random.default_rng(2)
    y = 3 * GiB + rng.normal(0, 0.01 * GiB, 237)
    y[100] += 4 * GiB
    cpu = imported(app.api, "cpu", decaying(), memory=memory_csv(-1, y, 64 * GiB))
    text = json.dumps(app.api.get(f"/api/jobs/{cpu['id']}/alerts").json())
    spike = alerts(app, cpu["id"])["vram_spike"]
    assert spike["message"].startswith("host memory: 1 transient memory spike") and "GPU -1" not in text


def test_advice_says_what_it_changes_and_carries_the_change(app, tmp_path):
    periodic = next(t for t in generate(1) if t.name == "periodic-ga8-1")
    folder = write_run(periodic, tmp_path)
    files = {
        "trainer_log": (folder / "output" / "trainer_log.jsonl").read_bytes(),
        "memory": (folder / "memory.csv").read_bytes(),
        "config": (folder / "train.yaml").read_bytes(),
    }
    job = app.api.post("/api/runs/import", files=files, data={"name": "ga8"}).json()
    spikes = alerts(app, job["id"])["vram_periodic_spikes"]
    # Spikes at every optimizer step are the step's own memory: the advice names that cause, says why
    # gradient_accumulation_steps (how often, not how high) is no cure, and carries no key change.
    assert spikes["suggestion"].startswith("the optimizer step's own working memory")
    for consequence in (
        "gradient_accumulation_steps is 8 and the spikes recur every 8 micro-batches",
        "that sets how often, not how high",
        "keep that much headroom above the level between steps",
    ):
        assert consequence in spikes["suggestion"], consequence
    assert spikes["change"] is None
    nan = imported(app.api, "fp16-nan", [2.5, float("nan")], "fp16: true\nlearning_rate: 2.0e-4\n")
    loss_nan = alerts(app, nan["id"])["loss_nan"]
    assert loss_nan["change"] == {"bf16": True, "fp16": False}
    assert "no overflow to inf" in loss_nan["suggestion"]
    assert "lower learning_rate from 2e-4 to 2e-5 (smaller, steadier updates" in loss_nan["suggestion"]
    # Advice that is no key change carries none.
    folder = write_run(next(t for t in generate(0) if t.name == "hang-0"), tmp_path)
    files = {k: (folder / p).read_bytes() for k, p in (("trainer_log", "output/trainer_log.jsonl"),)}
    hang = app.api.post("/api/runs/import", files=files, data={"name": "hang"}).json()
    assert all(a["change"] is None for a in alerts(app, hang["id"]).values() if a["kind"] == "stall")


def test_a_loss_stuck_high_is_a_problem_with_a_lower_learning_rate(app):
    job = imported(app.api, "lr200", [9.1, 7.4] + [6.1225] * 37, "learning_rate: 200\n")
    stuck = alerts(app, job["id"])["loss_stuck"]
    assert stuck["severity"] == "warning" and "loss stuck at 6.1225 for 37 logged points" in stuck["message"]
    assert "learning_rate is 200" in stuck["suggestion"] and stuck["change"] == {"learning_rate": 0.0001}
    assert job["verdict"] == "succeeded_with_problems" and job["alerts"]["problems"] == ["loss_stuck"]
    # A run that learned: its tail wobbles with the batches, or sits far below where it began.
    converged = imported(app.api, "converged", [2.5, 2.0, 1.6, 1.3, 1.1] + [0.41, 0.415, 0.405] * 14)
    assert "loss_stuck" not in alerts(app, converged["id"])
    near_zero = imported(app.api, "near zero", [2.5, 2.0, 1.6, 1.3, 1.1] + [0.2] * 40)
    assert "loss_stuck" not in alerts(app, near_zero["id"])
    # Frozen to the digit after it came down part of the way: updates stopped, it is stuck.
    frozen = imported(app.api, "frozen", [2.5, 2.0, 1.6, 1.3, 1.1] + [0.6] * 40)
    assert "loss_stuck" in alerts(app, frozen["id"])


@pytest.mark.timeout(300)
def test_an_alert_that_closes_reaches_the_open_streams(app, assets):
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="live", runner_token="r")
    points = [{"current_steps": 1, "loss": 2.5}, {"current_steps": 2, "loss": float("nan")}]
    assert post_telemetry(app.api, job.id, "r", seq=0, points=points).status_code == 200
    until(lambda: alerts(app, job.id).get("loss_nan", {}).get("open"), "an open loss_nan alert")
    with app.api.stream("GET", "/api/stream", params={"job": job.id}) as r:
        stream = events(r)
        first = next(ev for ev in stream if ev["event"] == "job")
        assert first["data"]["alerts"]["open"] == 1
        # The loss is finite again: the engine closes the alert, and the job's row goes out again.
        post_telemetry(app.api, job.id, "r", seq=1, start_line=2, points=[{"current_steps": 3, "loss": 2.2}])
        row = next(ev["data"] for ev in stream if ev["event"] == "job" and ev["data"]["alerts"]["open"] == 0)
    assert row["alerts"]["worst"] == "critical" and not alerts(app, job.id)["loss_nan"]["open"]

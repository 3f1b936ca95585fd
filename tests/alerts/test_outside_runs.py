"""Runs from outside tunedeck: `tunedeck analyze` over corpus run folders, and the import API."""

from __future__ import annotations

import json
import subprocess
import threading
from datetime import datetime, timezone
from http.server import HTTPServer

import pytest
from typer.testing import CliRunner

from tests.alerts.corpus import generate, write_run
from tests.security.test_auth import bearer, token
from tests.utils.wait import until
from tests.utils.webhooks import Receiver
from tunedeck.cli.main import app as cli_app


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return [(tr, write_run(tr, folder)) for tr in generate(4)]


def analyze(*args: str) -> subprocess.CompletedProcess:
    # In this process: the command reads no settings, and fifteen interpreter starts cost more than the analyses.
    r = CliRunner().invoke(cli_app, ["analyze", *args], catch_exceptions=False)
    return subprocess.CompletedProcess(["tunedeck", "analyze", *args], r.exit_code, r.stdout, r.stderr)


def test_analyze_prints_the_labelled_alerts(runs):
    for tr, folder in runs:
        r = analyze(str(folder), "--memory", str(folder / "memory.csv"), "--json")
        assert r.returncode == 0, r.stderr
        found = json.loads(r.stdout)
        assert {f["kind"] for f in found} == tr.labels, tr.name
        assert all(
            set(f) == {"kind", "severity", "gpu", "t", "step", "message", "suggestion", "change"}
            for f in found
        )


def test_analyze_text_and_errors(runs, tmp_path):
    _, folder = next(x for x in runs if x[0].name.startswith("periodic-ga8"))
    r = analyze(
        str(folder / "output"), "--memory", str(folder / "memory.csv"), "--config", str(folder / "train.yaml")
    )
    assert r.returncode == 0 and "WARNING  vram_periodic_spikes GPU 0" in r.stdout
    assert (
        "gradient_accumulation_steps is 8" in r.stdout and "optimizer step's own working memory" in r.stdout
    )
    r = analyze(str(tmp_path))
    assert r.returncode == 2 and "no trainer_log.jsonl" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("time,used\n1,2\n")
    r = analyze(str(folder), "--memory", str(bad))
    assert r.returncode == 2 and "t,gpu,used_bytes,total_bytes" in r.stderr


def test_import_stores_a_finished_job_with_charts_and_alerts(app_factory, runs):
    server = app_factory()
    tr, folder = next(x for x in runs if x[0].name.startswith("ramp-oom"))
    # The whole output as a trainer writes it: ordinary lines, a progress bar redrawn in place, the error.
    output = "Loading model 100_% done\n\nTokenizing:  10%|#\rTokenizing: 100%|##########\r\n"
    output += (folder / "output" / "train.log").read_text()
    files = {
        "trainer_log": (folder / "output" / "trainer_log.jsonl").read_bytes(),
        "memory": (folder / "memory.csv").read_bytes(),
        "config": (folder / "train.yaml").read_bytes(),
        "log": output.encode(),
    }
    r = server.api.post("/api/runs/import", files=files, data={"name": "cli run"})
    assert r.status_code == 201, r.text
    job = r.json()
    # The run's log ends in an out-of-memory error: the import says it failed, and why.
    assert job["status"] == "failed" and job["name"] == "cli run", job
    assert job["error"].startswith("out of memory: torch.OutOfMemoryError"), job["error"]
    files = server.api.get(f"/api/jobs/{job['id']}/files").json()
    assert [f["path"] for f in files] == ["trainer_log.jsonl"]
    assert len(server.all(job["id"], "metrics")) == len(tr.series.points)
    mem = server.api.get(f"/api/jobs/{job['id']}/memory", params={"limit": 5000}).json()
    assert len(mem["samples"]) == len(tr.series.memory[0])
    small = server.api.get(f"/api/jobs/{job['id']}/memory", params={"max_points": 50}).json()
    assert small["downsampled"] and max(s["used_bytes"] for s in small["samples"]) == max(
        u for _, u, _ in tr.series.memory[0]
    )
    alerts = server.api.get(f"/api/jobs/{job['id']}/alerts").json()
    assert {a["kind"] for a in alerts} == tr.labels and not any(a["open"] for a in alerts)
    # Its output is served as a launched job's is, every line, and searched.
    logs = f"/api/jobs/{job['id']}/logs"
    lines = [g["text"] for g in server.all(job["id"], "logs")]
    assert lines[:2] == ["Loading model 100_% done", "Tokenizing: 100%|##########"], lines[:3]
    assert lines[2:] == [x for x in (folder / "output" / "train.log").read_text().splitlines() if x]
    found = server.api.get(logs, params={"q": "OUTOFMEMORYERROR"}).json()["lines"]
    assert found and all("OutOfMemoryError" in g["text"] for g in found)
    assert [g["text"] for g in server.api.get(logs, params={"q": "0_%"}).json()["lines"]] == [lines[0]]
    assert server.api.get(logs, params={"q": "%"}).json()["lines"][0]["text"] == lines[0]
    r = server.api.get(logs, params={"grep": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "grep"], r.text
    r = server.api.post("/api/runs/import", files={"trainer_log": b"{not json\n"})
    assert r.status_code == 422 and "line 1" in r.json()["detail"][0]["msg"]


def test_an_import_has_its_owner_and_tells_the_webhooks(server_factory, runs, tmp_path):
    http = HTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.got = []
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        alice = token(tmp_path / "ws", "alice", "submitter")
        server = server_factory(
            TUNEDECK_OPEN_WRITE="false",
            TUNEDECK_WEBHOOK_MIN_SEVERITY="info",
            TUNEDECK_WEBHOOK_URLS=json.dumps([f"http://127.0.0.1:{http.server_port}/hook"]),
        )
        tr, folder = next(x for x in runs if x[0].name.startswith("ramp-oom"))
        files = {
            "trainer_log": (folder / "output" / "trainer_log.jsonl").read_bytes(),
            "memory": (folder / "memory.csv").read_bytes(),
            "config": (folder / "train.yaml").read_bytes(),
            "log": (folder / "output" / "train.log").read_bytes(),
        }
        assert server.api.post("/api/runs/import", files=files, data={"name": "x"}).status_code == 401
        r = server.api.post(
            "/api/runs/import", files=files, data={"name": "alice run"}, headers=bearer(alice)
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["owner"] == "alice"
        until(lambda: any(g["event"] == "job_finished" for g in Receiver.got), "the job_finished webhook")
    finally:
        http.shutdown()
    (done,) = [g for g in Receiver.got if g["event"] == "job_finished"]
    assert done["job_id"] == job["id"] and done["status"] == "failed"
    assert done["text"].startswith(f"tunedeck: job {job['id']} (alice run) failed: out of memory: "), done[
        "text"
    ]
    sent = {g["kind"] for g in Receiver.got if g["event"] == "alert" and g["job_id"] == job["id"]}
    assert sent == tr.labels  # every alert of the run, as a live run's would be


def test_an_import_is_dated_by_its_own_times_and_its_environment_is_unknown(app_factory, runs):
    server = app_factory()
    # Wall-clock times (the memory CSV's): the run starts and ends where they say.
    tr, folder = next(x for x in runs if x[0].name.startswith("plateau"))
    files = {
        k: (folder / p).read_bytes()
        for k, p in (("trainer_log", "output/trainer_log.jsonl"), ("memory", "memory.csv"))
    }
    job = server.api.post("/api/runs/import", files=files, data={"name": "dated"}).json()
    times = [p.t for p in tr.series.points] + [t for xs in tr.series.memory.values() for t, _, _ in xs]
    assert datetime.fromisoformat(job["started_at"]).timestamp() == pytest.approx(min(times), abs=1e-3)
    assert datetime.fromisoformat(job["finished_at"]).timestamp() == pytest.approx(max(times), abs=1e-3)

    # Only elapsed_time (LLaMA-Factory's own log, no memory CSV): its span kept, ending at its import.
    lines = [
        {"current_steps": k, "total_steps": 4, "loss": 2.0 - 0.1 * k, "elapsed_time": f"0:{2 * k:02d}:00"}
        for k in range(1, 5)
    ]
    before = datetime.now(timezone.utc)
    body = "".join(json.dumps(x) + "\n" for x in lines).encode()
    job = server.api.post("/api/runs/import", files={"trainer_log": body}, data={"name": "undated"}).json()
    started, finished = (datetime.fromisoformat(job[k]) for k in ("started_at", "finished_at"))
    assert before <= finished <= datetime.now(timezone.utc)
    assert (finished - started).total_seconds() == pytest.approx(6 * 60, abs=1e-3)  # minute 2 to minute 8
    points = server.all(job["id"], "metrics")
    assert points[0]["t"] == pytest.approx(started.timestamp(), abs=1e-3)  # charts start then, not in 1970

    report = server.api.get(f"/api/jobs/{job['id']}/report").text
    assert "Unknown: this run was imported" in report
    assert "No preflight of the training environment" not in report

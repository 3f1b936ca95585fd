"""The vertical slice end to end: a real server, real runners, real LLaMA-Factory on a tiny model."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.utils.servers import CONFIGS, demo_config, job_processes
from tests.utils.wait import until

# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def trainer_lines(job: dict) -> list[dict]:
    path = Path(job["output_dir"]) / "trainer_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_metrics_match(server, job: dict) -> list[dict]:
    """The stored points are exactly the trainer_log.jsonl lines: same count, same values, once each."""
    points = server.all(job["id"], "metrics")
    lines = trainer_lines(job)
    assert len(points) == len(lines) > 0
    for p, line in zip(points, lines):
        assert p["step"] == line["current_steps"]
        # throughput is not the line's: tunedeck measures it (services/ingest/pace.py, tests/test_lifecycle.py).
        for key in ("loss", "eval_loss", "lr", "epoch", "total_tokens"):
            assert p[key] == line.get(key), (key, p, line)
    return points


def assert_succeeded_in_full(server, job: dict) -> None:
    """A launched job that ran to its end: every point stored once, loss down, eval run, the adapter
    saved, what ran is what the API shows, clean logs, nothing left running."""
    assert job["status"] == "succeeded", job
    assert job["exit_code"] == 0 and job["error"] is None
    assert job["progress"]["current_steps"] == job["progress"]["total_steps"] == 20

    points = assert_metrics_match(server, job)
    losses = [p["loss"] for p in points if p["loss"] is not None]
    assert losses[-1] < losses[0]
    assert any(p["eval_loss"] is not None for p in points)
    assert all(p["throughput"] and p["total_tokens"] for p in points if p["loss"] is not None)
    out = Path(job["output_dir"])
    assert (out / "adapter_model.safetensors").exists()
    # The CPU job's host memory: the live tree's in every sample, no 0 B one after the trainer exited
    # (the downsampling keeps each bucket's minimum: a drop would show).
    samples = server.api.get(f"/api/jobs/{job['id']}/memory", params={"limit": 20000}).json()["samples"]
    assert samples and all(m["used_bytes"] > 0 for m in samples), samples[-3:]

    # What ran is what the API shows; tunedeck chose the output folder.
    config = server.api.get(f"/api/jobs/{job['id']}/config").json()
    assert (Path(job["run_dir"]) / "train.yaml").read_text() == config["train_yaml"]
    assert f"output_dir: {job['output_dir']}" in config["train_yaml"]
    logs = server.all(job["id"], "logs")
    assert logs and not any("\r" in g["text"] or "\x1b" in g["text"] for g in logs)
    files = server.api.get(f"/api/jobs/{job['id']}/files").json()
    assert any(f["path"] == "adapter_model.safetensors" for f in files)
    assert job_processes(job["run_dir"]) == []


def stale_build_lock(torch_extensions: Path) -> Path:
    """The lock a killed build of DeepSpeed's CPU comm op would leave, as old as it gets."""
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    left = torch_extensions / ShareMemCommBuilder.NAME / "lock"
    left.parent.mkdir(parents=True, exist_ok=True)
    left.touch()
    os.utime(left, (0, 0))
    return left


@pytest.mark.parametrize("deepspeed", [None, "ds_z3_rocm"], ids=["plain", "zero3-torchrun"])
def test_cancel_is_graceful_and_leaves_nothing(server_factory, assets, torch_extensions, tmp_path, deepspeed):
    """A cancel stops after a step with the adapter saved and nothing left running. With the seed's
    ds_z3_rocm.json (its typo removed; fp16 off on the CPU) it runs ZeRO-3 under torchrun, where only
    the workers hold the stop handler, and a lock that a killed build of DeepSpeed's CPU op left
    behind does not hang it (lf_train.clear_stale_build_locks). In a parallel run that lock is in an
    extensions folder of the test's own (the op builds there): the run's shared one serves the other
    xdist worker's DeepSpeed jobs too, and theirs would clear it first."""
    ds = left = None
    env = {}
    if deepspeed:
        ds = json.loads((CONFIGS / f"{deepspeed}.json").read_text())
        ds["fp16"]["enabled"] = False
        if os.environ.get("PYTEST_XDIST_WORKER"):
            own = tmp_path / "torch_extensions"
            env["TORCH_EXTENSIONS_DIR"] = str(own)
        else:
            own = torch_extensions
        left = stale_build_lock(own)
    server = server_factory(**env)
    created = server.submit(
        {
            "name": "long",
            "config": demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=2),
            "deepspeed": ds,
            "gpus": 0,
        }
    )
    # An eval point as well: the ZeRO-3 run has gathered its parameters to evaluate.
    until(
        lambda: any(
            p["eval_loss"] is not None
            for p in server.api.get(f"/api/jobs/{created['id']}/metrics").json()["points"]
        ),
        "an eval point",
        400,
        explain=lambda: server.explain(created["id"]),
    )
    assert server.api.post(f"/api/jobs/{created['id']}/cancel").status_code == 200
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"), timeout=120)
    assert job["status"] == "cancelled", job
    assert job["exit_code"] == 0  # LLaMA-Factory stopped after the step, not killed
    assert (Path(job["output_dir"]) / "adapter_model.safetensors").exists()
    assert job["progress"]["current_steps"] < 2000
    assert_metrics_match(server, job)
    assert job_processes(job["run_dir"]) == []
    assert server.api.post(f"/api/jobs/{created['id']}/cancel").status_code == 409
    if deepspeed:
        config = server.api.get(f"/api/jobs/{job['id']}/config").json()
        assert json.loads(config["ds_config"])["zero_optimization"]["stage"] == 3
        assert "stage3_parition_grads" not in config["ds_config"]
        logs = " ".join(g["text"] for g in server.all(job["id"], "logs"))
        assert "DeepSpeed" in logs or "deepspeed" in logs
        assert f"removed {left}" in logs and not left.exists()


def test_bad_dataset_fails_with_cause(server_factory, assets):
    """Failures lint cannot judge fail at run time, each with the exception that ended the run and
    where it was raised: a dataset whose entry is there and its file is not, and a multimodal template
    for a text-only model (a template of the model's family, so lint lets it by)."""
    server = server_factory()
    data = server.workspace / "data"
    data.mkdir(parents=True, exist_ok=True)
    entry = json.loads((assets / "demo" / "data" / "dataset_info.json").read_text())["demo_identity"]
    (data / "dataset_info.json").write_text(json.dumps({"gone": {**entry, "file_name": "gone.json"}}))
    created = server.submit(
        {"name": "bad data", "config": demo_config(assets, dataset="gone", dataset_dir=str(data)), "gpus": 0}
    )
    template = server.submit(
        {"name": "bad template", "config": demo_config(assets, template="qwen2_vl", max_steps=2), "gpus": 0}
    )
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"))
    assert job["status"] == "failed" and job["exit_code"] == 1
    assert re.fullmatch(
        rf"ValueError: File {re.escape(str(data))}/gone\.json not found\. "
        r"\(at llamafactory/data/loader\.py:\d+, in _load_single_dataset\)",
        job["error"],
    ), job["error"]
    job = server.wait(template["id"], ("succeeded", "failed", "cancelled"))
    assert job["status"] == "failed" and job["exit_code"] == 1
    assert re.fullmatch(
        r"ValueError: Processor was not found, please check and update your model file\. "
        r"\(at llamafactory/data/mm_plugin\.py:\d+, in _validate_input\)",
        job["error"],
    ), job["error"]


def test_refused_before_launch(app_factory, assets, tmp_path):
    server = app_factory()
    r = server.api.post("/api/jobs", json={"name": "typo", "config": demo_config(assets, learning_rat=1e-3)})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["config", "learning_rat"] and "learning_rate" in err["msg"]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = server.api.post(
        "/api/jobs", json={"name": "escape", "config": demo_config(assets, model_name_or_path=str(outside))}
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["config", "model_name_or_path"]
    assert "outside the allowed roots" in r.json()["detail"][0]["msg"]
    assert server.api.get("/api/jobs").json()["jobs"] == []  # nothing was created
    assert not (server.workspace / "runs").exists() or not any((server.workspace / "runs").iterdir())


def test_second_job_waits_for_a_slot(server_factory, assets):
    """Submit, run, succeed in full (the first job); a second waits for the one CPU slot."""
    server = server_factory(TUNEDECK_CPU_SLOTS="1")
    first = server.submit({"name": "first", "config": demo_config(assets), "gpus": 0})
    assert first["status"] == "queued"
    second = server.submit({"name": "second", "config": demo_config(assets), "gpus": 0})
    server.wait(first["id"], ("running",), timeout=240)
    assert server.api.get(f"/api/jobs/{second['id']}").json()["status"] == "queued"
    a = server.wait(first["id"], ("succeeded", "failed"), timeout=400)
    assert_succeeded_in_full(server, a)
    b = server.wait(second["id"], ("succeeded", "failed"), timeout=400)
    assert a["status"] == b["status"] == "succeeded"
    assert b["started_at"] >= a["finished_at"]
    r = server.api.post("/api/jobs", json={"name": "too big", "config": demo_config(assets), "gpus": 2})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["gpus"]

"""The vertical slice end to end: a real server, real runners, real LLaMA-Factory on a tiny model."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.utils.servers import CONFIGS, demo_config, job_processes, wait_buffered
from tests.utils.wait import until

pytestmark = pytest.mark.slow


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


def test_submit_run_succeed(server_factory, assets):
    server = server_factory()
    created = server.submit({"name": "tiny sft", "config": demo_config(assets), "gpus": 0})
    assert created["status"] == "queued"
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"))
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

    # What ran is what the API shows; tunedeck chose the output folder.
    config = server.api.get(f"/api/jobs/{job['id']}/config").json()
    assert (Path(job["run_dir"]) / "train.yaml").read_text() == config["train_yaml"]
    assert f"output_dir: {job['output_dir']}" in config["train_yaml"]
    logs = server.all(job["id"], "logs")
    assert logs and not any("\r" in g["text"] or "\x1b" in g["text"] for g in logs)
    files = server.api.get(f"/api/jobs/{job['id']}/files").json()
    assert any(f["path"] == "adapter_model.safetensors" for f in files)
    assert job_processes(job["run_dir"]) == []


def test_deepspeed_zero3_seed_config(server_factory, assets, torch_extensions):
    """The seed's ds_z3_rocm.json with its typo removed; fp16 off on the CPU. A lock that a killed
    build of DeepSpeed's CPU comm op left behind does not hang it (lf_train.clear_stale_build_locks)."""
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ds = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())
    ds["fp16"]["enabled"] = False
    left = torch_extensions / ShareMemCommBuilder.NAME / "lock"
    left.parent.mkdir(exist_ok=True)
    left.touch()
    os.utime(left, (0, 0))  # as old as it gets: the build that took it is long gone
    server = server_factory()
    created = server.submit(
        {
            "name": "zero3",
            "config": demo_config(assets, max_steps=10, eval_steps=5, save_steps=10),
            "deepspeed": ds,
            "gpus": 0,
        }
    )
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"), timeout=400)
    assert job["status"] == "succeeded", job
    config = server.api.get(f"/api/jobs/{job['id']}/config").json()
    assert json.loads(config["ds_config"])["zero_optimization"]["stage"] == 3
    assert "stage3_parition_grads" not in config["ds_config"]
    assert_metrics_match(server, job)
    logs = " ".join(g["text"] for g in server.all(job["id"], "logs"))
    assert "DeepSpeed" in logs or "deepspeed" in logs
    assert f"removed {left}" in logs and not left.exists()


@pytest.mark.parametrize("deepspeed", [None, "ds_z3_rocm"], ids=["plain", "zero3-torchrun"])
def test_cancel_is_graceful_and_leaves_nothing(server_factory, assets, deepspeed):
    server = server_factory()
    ds = None
    if deepspeed:  # under torchrun only the workers hold the stop handler
        ds = json.loads((CONFIGS / f"{deepspeed}.json").read_text())
        ds["fp16"]["enabled"] = False
    created = server.submit(
        {
            "name": "long",
            "config": demo_config(assets, max_steps=2000, save_steps=1000),
            "deepspeed": ds,
            "gpus": 0,
        }
    )
    until(
        lambda: server.api.get(f"/api/jobs/{created['id']}/metrics").json()["points"],
        "a metric point",
        240,
        explain=lambda: server.explain(created["id"]),
    )
    assert server.api.post(f"/api/jobs/{created['id']}/cancel").status_code == 200
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"), timeout=120)
    assert job["status"] == "cancelled", job
    assert job["exit_code"] == 0  # LLaMA-Factory stopped after the step, not killed
    assert (Path(job["output_dir"]) / "adapter_model.safetensors").exists()
    assert job["progress"]["current_steps"] < 2000
    assert job_processes(job["run_dir"]) == []
    assert server.api.post(f"/api/jobs/{created['id']}/cancel").status_code == 409


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


def test_server_killed_mid_run_loses_nothing(server_factory, assets):
    server = server_factory()
    created = server.submit({"name": "survivor", "config": demo_config(assets, max_steps=60), "gpus": 0})
    until(
        lambda: server.api.get(f"/api/jobs/{created['id']}/metrics").json()["points"],
        "a metric point",
        240,
        explain=lambda: server.explain(created["id"]),
    )
    server.kill()
    wait_buffered(created["run_dir"])  # the runner keeps training and buffers while the server is away
    server.start()
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"))
    assert job["status"] == "succeeded", job
    assert_metrics_match(server, job)
    logs = server.all(job["id"], "logs")
    assert len({g["id"] for g in logs}) == len(logs)


def test_second_job_waits_for_a_slot(server_factory, assets):
    server = server_factory(TUNEDECK_CPU_SLOTS="1")
    first = server.submit({"name": "first", "config": demo_config(assets), "gpus": 0})
    second = server.submit({"name": "second", "config": demo_config(assets), "gpus": 0})
    server.wait(first["id"], ("running",), timeout=240)
    assert server.api.get(f"/api/jobs/{second['id']}").json()["status"] == "queued"
    a = server.wait(first["id"], ("succeeded", "failed"))
    b = server.wait(second["id"], ("succeeded", "failed"))
    assert a["status"] == b["status"] == "succeeded"
    assert b["started_at"] >= a["finished_at"]
    r = server.api.post("/api/jobs", json={"name": "too big", "config": demo_config(assets), "gpus": 2})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["gpus"]

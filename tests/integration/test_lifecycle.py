"""A job's lifecycle on a real tiny-model run: stop, checkpoints, resume, clone, artifacts, tags, delete.

One parent run is stopped at a step that is not a save step and resumed; every test of the module
reads those two jobs (module-scoped), so the fine-tunes run once.
"""

from __future__ import annotations

import io
import json
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import Server, demo_config

pytestmark = pytest.mark.slow
ENDED = ("succeeded", "failed", "cancelled")
MAX_STEPS = 20


def until(check, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stepped(server: Server, job_id: int) -> list[dict]:
    return [p for p in server.all(job_id, "metrics") if p["loss"] is not None]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, assets):
    """A server; a parent stopped at step N (no save step: save_steps is past max_steps); an
    uninterrupted clone of it (the reference); and the parent's resume."""
    server = Server(tmp_path_factory.mktemp("lifecycle") / "ws", assets).start()
    # Every step logged; no step is a save step, so only the stop can leave a checkpoint.
    config = demo_config(assets, max_steps=MAX_STEPS, logging_steps=1, save_steps=1000, eval_steps=1000)
    parent = server.submit({"name": "parent run", "config": config, "gpus": 0})
    until(
        lambda: (server.api.get(f"/api/jobs/{parent['id']}").json()["progress"]["current_steps"] or 0) >= 3,
        "the parent's third step",
    )
    refused = server.api.delete(f"/api/jobs/{parent['id']}")  # while it runs
    assert server.api.post(f"/api/jobs/{parent['id']}/cancel").status_code == 200
    # The same spec but a key that changes nothing of the training: the uninterrupted reference.
    reference = server.api.post(
        f"/api/jobs/{parent['id']}/clone", json={"overrides": {"save_steps": 500}, "name": "reference run"}
    )
    assert reference.status_code == 201, reference.text
    parent = server.wait(parent["id"], ENDED)
    resumed = server.api.post(f"/api/jobs/{parent['id']}/resume", json={})
    assert resumed.status_code == 201, resumed.text
    child = server.wait(resumed.json()["id"], ENDED, timeout=600)
    reference = server.wait(reference.json()["id"], ENDED, timeout=600)
    yield {"server": server, "parent": parent, "child": child, "reference": reference, "refused": refused}
    server.stop()


def test_a_stop_saves_a_full_checkpoint_at_its_step(lab):
    server, parent = lab["server"], lab["parent"]
    assert parent["status"] == "cancelled", parent
    last = stepped(server, parent["id"])[-1]["step"]
    assert 3 <= last < MAX_STEPS
    cps = server.api.get(f"/api/jobs/{parent['id']}/checkpoints").json()
    assert [c["name"] for c in cps] == [f"checkpoint-{last}"]  # the stop's, at the step it stopped
    cp = cps[0]
    assert cp["step"] == last and cp["resumable"] and cp["bytes"] > 0
    assert {"adapter", "optimizer", "scheduler", "rng", "trainer_state"} <= set(cp["holds"])


def test_the_resumed_job_continues_at_the_next_step(lab):
    server, parent, child, reference = lab["server"], lab["parent"], lab["child"], lab["reference"]
    assert child["status"] == reference["status"] == "succeeded", (child, reference)
    assert child["parent_id"] == reference["parent_id"] == parent["id"]
    before, after = stepped(server, parent["id"]), stepped(server, child["id"])
    steps_lost = after[0]["step"] - before[-1]["step"] - 1
    assert steps_lost == 0, (before[-1], after[0])
    assert [p["step"] for p in after] == list(range(after[0]["step"], MAX_STEPS + 1))
    # Weights, optimizer, scheduler, RNG and data position all came back: the resumed steps are the
    # uninterrupted run's steps, loss and learning rate alike.
    uninterrupted = {p["step"]: p for p in stepped(server, reference["id"])}
    assert [p["step"] for p in before + after] == sorted(uninterrupted)
    for p in before + after:
        same = uninterrupted[p["step"]]
        assert p["lr"] == pytest.approx(same["lr"], rel=1e-6), (p, same)
        assert p["loss"] == pytest.approx(same["loss"], rel=2e-3, abs=1e-3), (p, same)
    config = server.api.get(f"/api/jobs/{child['id']}/config").json()["train_yaml"]
    assert f"resume_from_checkpoint: {parent['output_dir']}/checkpoint-{before[-1]['step']}" in config
    # grad_norm of every training step, which trainer_log.jsonl leaves out.
    assert all(p["grad_norm"] is not None and p["grad_norm"] >= 0 for p in before + after)
    series = server.api.get(f"/api/jobs/{child['id']}/series").json()["series"]
    assert len(series["grad_norm"]["y"]) == len(after)


def test_tokens_per_second_after_a_resume_is_the_parents(lab):
    server, parent, child = lab["server"], lab["parent"], lab["child"]
    speed = {
        j["id"]: statistics.median(p["throughput"] for p in stepped(server, j["id"])[1:] if p["throughput"])
        for j in (parent, child)
    }
    ratio = speed[child["id"]] / speed[parent["id"]]
    # LLaMA-Factory's own figure after a resume counts the parent's tokens over the child's time.
    logged = [json.loads(line) for line in (Path(child["output_dir"]) / "trainer_log.jsonl").open()]
    assert 1 / 4 < ratio < 4, (speed, [x.get("throughput") for x in logged[:5]])


def test_download_a_file_with_a_range_and_nothing_outside(lab):
    server, parent = lab["server"], lab["parent"]
    path = Path(parent["output_dir"]) / "adapter_config.json"
    whole = server.api.get(f"/api/jobs/{parent['id']}/files/adapter_config.json")
    assert whole.status_code == 200 and whole.content == path.read_bytes()
    part = server.api.get(
        f"/api/jobs/{parent['id']}/files/adapter_config.json", headers={"Range": "bytes=5-14"}
    )
    assert part.status_code == 206 and part.content == path.read_bytes()[5:15]
    assert part.headers["content-range"] == f"bytes 5-14/{path.stat().st_size}"
    for sneaky in ("..%2Frunner.json", "..%2F..%2F..%2Ftunedeck.db", "%2Fetc%2Fpasswd"):
        assert server.api.get(f"/api/jobs/{parent['id']}/files/{sneaky}").status_code == 404, sneaky


def test_the_adapter_archive_loads_with_peft(lab, tmp_path, assets):
    server, child = lab["server"], lab["child"]
    r = server.api.get(f"/api/jobs/{child['id']}/archive", params={"what": "adapter"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    zipfile.ZipFile(io.BytesIO(r.content)).extractall(tmp_path)
    adapter = tmp_path / f"job{child['id']}-adapter"
    assert (adapter / "adapter_model.safetensors").read_bytes() == (
        Path(child["output_dir"]) / "adapter_model.safetensors"
    ).read_bytes()
    tar = server.api.get(
        f"/api/jobs/{child['id']}/archive", params={"what": "adapter", "format": "tar"}
    ).content
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert sorted(m.name for m in t.getmembers()) == sorted(
            f"{adapter.name}/{p.name}" for p in adapter.iterdir()
        )
    probe = (
        "import sys, torch; from peft import PeftModel; from transformers import AutoModelForCausalLM;"
        "base = AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
        "m = PeftModel.from_pretrained(base, sys.argv[2]);"
        "n = sum(1 for k, _ in m.named_parameters() if 'lora_' in k); assert n > 0, n;"
        "print('lora tensors', n)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(assets / "demo" / "model"), str(adapter)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "lora tensors" in done.stdout, done.stderr[-2000:]


def test_clone_with_an_override_is_checked_like_a_submit(lab, assets):
    server, parent, reference = lab["server"], lab["parent"], lab["reference"]
    assert reference["name"] == "reference run"
    reference_yaml = server.api.get(f"/api/jobs/{reference['id']}/config").json()["train_yaml"]
    assert "save_steps: 500\n" in reference_yaml
    r = server.api.post(
        f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_steps": 2, "warmup_steps": None}}
    )
    assert r.status_code == 201, r.text
    clone = r.json()
    assert clone["parent_id"] == parent["id"] and clone["name"] == parent["name"]
    stop(server, clone["id"])
    yaml_text = server.api.get(f"/api/jobs/{clone['id']}/config").json()["train_yaml"]
    assert "max_steps: 2\n" in yaml_text and "warmup_steps" not in yaml_text
    bad = server.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_stepz": 2}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "overrides", "max_stepz"]
    as_submit = server.api.post(
        "/api/jobs", json={"name": "x", "config": {**demo_config(assets), "max_steps": -3}}
    )
    as_clone = server.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_steps": -3}})
    assert as_clone.status_code == as_submit.status_code == 422
    assert as_clone.json()["detail"] == as_submit.json()["detail"]


def stop(server: Server, job_id: int) -> dict:
    """Cancel a job just made (it need not train for these checks) and wait for its end."""
    server.api.post(f"/api/jobs/{job_id}/cancel")
    return server.wait(job_id, ENDED)


def test_tags_notes_search_and_delete(lab):
    server, parent, child = lab["server"], lab["parent"], lab["child"]
    assert lab["refused"].status_code == 409  # the parent, while it ran
    r = server.api.patch(
        f"/api/jobs/{child['id']}", json={"tags": ["keep", "lr-sweep"], "notes": "the baseline"}
    )
    assert r.status_code == 200 and r.json()["tags"] == ["keep", "lr-sweep"]
    server.api.patch(f"/api/jobs/{parent['id']}", json={"tags": ["lr-sweep"]})

    def ids(**params) -> list[int]:
        r = server.api.get("/api/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    assert ids(tag="keep") == [child["id"]]
    assert ids(tag="lr-sweep") == [child["id"], parent["id"]]
    assert ids(q="BASELINE") == [child["id"]]  # notes, any case
    assert ids(q="REFERENCE") == [lab["reference"]["id"]]  # names
    assert child["id"] in ids(q="parent run")  # the resume keeps its parent's name
    assert ids(q="%") == []  # a wildcard is a character
    assert parent["id"] in ids(status="cancelled") and child["id"] not in ids(status="cancelled")
    assert ids(created_after="2999-01-01T00:00:00Z") == []
    assert set(ids(created_before="2999-01-01T00:00:00Z")) >= {parent["id"], child["id"]}
    bad = server.api.get("/api/jobs", params={"tags": "keep"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "tags"]
    assert server.api.patch(f"/api/jobs/{child['id']}", json={"tags": ["no spaces"]}).status_code == 422

    # Delete: the row goes; the files stay unless asked.
    kept = server.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_steps": 1}}).json()
    stop(server, kept["id"])
    assert server.api.delete(f"/api/jobs/{kept['id']}", params={"files": "keep"}).status_code == 200
    assert server.api.get(f"/api/jobs/{kept['id']}").status_code == 404
    assert Path(kept["run_dir"]).is_dir()
    gone = server.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_steps": 1}}).json()
    stop(server, gone["id"])
    assert server.api.delete(f"/api/jobs/{gone['id']}", params={"files": "maybe"}).status_code == 422
    assert server.api.delete(f"/api/jobs/{gone['id']}", params={"files": "remove"}).status_code == 200
    assert not Path(gone["run_dir"]).exists()

"""A job's lifecycle on a real tiny-model run: a stop's checkpoint, its resume, the adapter download.

One parent run is stopped at a step that is not a save step and resumed, beside an uninterrupted
clone of it; every test of the module reads those jobs (module-scoped), so the fine-tunes run once.
The routes' other cases, on the app alone: tests/test_lifecycle_api.py.
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.utils.servers import Server, demo_config
from tests.utils.wait import until

pytestmark = pytest.mark.slow
ENDED = ("succeeded", "failed", "cancelled")
MAX_STEPS = 30  # a fast machine must not finish the parent before the stop lands


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
        timeout=240,
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
    assert lab["refused"].status_code == 409  # no delete while it ran
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


def test_tokens_per_second_after_a_resume_counts_only_its_own_tokens(lab):
    """LLaMA-Factory's own figure after a resume divides the parent's tokens too by the child's time.
    Ours: the tokens this job trained since its first logged step, over the time since then."""
    server, child = lab["server"], lab["child"]
    points = [p for p in server.all(child["id"], "metrics") if p["step"] is not None]
    first = points[0]
    assert first["total_tokens"] and first["step"] > 1  # LLaMA-Factory counts on from the parent's tokens
    rated = [p for p in points[1:] if p["throughput"] is not None]
    assert rated, points
    for p in rated:
        own = p["total_tokens"] - first["total_tokens"]
        assert p["throughput"] == pytest.approx(own / (p["t"] - first["t"]), rel=1e-9), p


def test_the_adapter_archive_loads_with_peft(lab, tmp_path, assets):
    server, child = lab["server"], lab["child"]
    r = server.api.get(f"/api/jobs/{child['id']}/archive", params={"what": "adapter"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    zipfile.ZipFile(io.BytesIO(r.content)).extractall(tmp_path)
    adapter = tmp_path / f"job{child['id']}-adapter"
    assert (adapter / "adapter_model.safetensors").read_bytes() == (
        Path(child["output_dir"]) / "adapter_model.safetensors"
    ).read_bytes()
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

"""A pickle is code: keys whose loader unpickles (checkpoints, `.bin` weights and adapters) are
accepted for what tunedeck's own runs wrote, or for safetensors weights, and refused otherwise at the
key (LF017) unless TUNEDECK_ALLOW_PICKLES is set (then a warning, LF018)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils.datasets import add_dataset
from tests.utils.servers import demo_config
from tunedeck.checks import reach
from tunedeck.checks.spec import SpecError
from tunedeck.checks.submission import Node, Submission, resolve
from tunedeck.config import Settings
from tunedeck.schemas import JobSpec

BASE = {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen", "finetuning_type": "lora"}
DEEPSPEED_CHECKPOINT = (
    "latest",
    "global_step5/mp_rank_00_model_states.pt",
    "global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "trainer_state.json",
    "adapter_model.safetensors",
)


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    ws = tmp_path / "ws"
    (ws / "models" / "m").mkdir(parents=True)
    add_dataset(ws / "data")  # the "d" every spec names
    return ws


def files(folder: Path, *names: str) -> str:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\x80\x04K\x01." if name.endswith((".pt", ".bin")) else b"{}")
    return str(folder)


def prepare(settings: Settings, **config) -> Submission:
    return resolve(JobSpec(name="t", config={**BASE, **config}), settings, Node()).checked()


def refused(settings: Settings, **config) -> dict[tuple, dict]:
    with pytest.raises(SpecError) as e:
        prepare(settings, **config)
    return {tuple(x["loc"]): x for x in e.value.errors}


def test_the_table_walk_finds_the_keys_that_unpickle_by_their_help():
    found = reach.lf_pickle_keys()
    assert found["resume_from_checkpoint"] == "checkpoint"
    weights = {"model_name_or_path", "adapter_name_or_path", "ref_model", "reward_model"}
    weights |= {"ref_model_adapters", "reward_model_adapters"}
    assert weights <= {k for k, v in found.items() if v == "weights"}
    assert not {"dataset_dir", "media_dir", "generation_config", "tokenized_path", "cache_dir"} & set(found)


def test_a_foreign_deepspeed_checkpoint_is_refused_at_the_key(ws):
    foreign = files(ws / "shared" / "ckpt", *DEEPSPEED_CHECKPOINT)  # inside the allowed roots
    e = refused(Settings(workspace=ws), resume_from_checkpoint=foreign)[("config", "resume_from_checkpoint")]
    assert e["code"] == "LF017" and e["type"] == "lint_error"
    assert "torch.load(weights_only=False)" in e["msg"] and "TUNEDECK_ALLOW_PICKLES" in e["msg"]
    assert "global_step5/mp_rank_00_model_states.pt" in e["msg"] or "latest" in e["msg"]
    # No pickle in it: nothing is unpickled. One that does not exist yet cannot be checked.
    plain = files(ws / "shared" / "plain", "trainer_state.json", "adapter_model.safetensors")
    prepare(Settings(workspace=ws), resume_from_checkpoint=plain)
    assert ("config", "resume_from_checkpoint") in refused(
        Settings(workspace=ws), resume_from_checkpoint=str(ws / "shared" / "later")
    )
    allowed = Settings(workspace=ws, allow_pickles=True)
    p = prepare(allowed, resume_from_checkpoint=foreign)
    (note,) = [f for f in p.findings if f["code"] == "LF018"]
    assert note["severity"] == "warning" and note["path"] == "config.resume_from_checkpoint"


@pytest.mark.parametrize(
    ("key", "pickled", "safe"),
    [
        ("adapter_name_or_path", ("adapter_model.bin",), "adapter_model.safetensors"),
        ("model_name_or_path", ("pytorch_model.bin",), "model.safetensors"),
        (
            "model_name_or_path",
            ("pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin"),
            "model.safetensors",
        ),
        ("reward_model", ("model.safetensors", "value_head.bin"), "value_head.safetensors"),
        ("ref_model_adapters", ("adapter_model.bin",), "adapter_model.safetensors"),
    ],
)
def test_bin_weights_from_outside_tunedecks_runs_need_safetensors(ws, key, pickled, safe):
    s = Settings(workspace=ws)
    folder = ws / "shared" / key
    files(folder, "config.json", "adapter_config.json", *pickled)
    e = refused(s, **{key: str(folder)})[("config", key)]
    assert e["code"] == "LF017" and "no safetensors file beside it" in e["msg"], e
    files(folder, safe)  # the loader takes the safetensors file and never opens the pickle
    prepare(s, **{key: str(folder)})
    files(folder, "training_args.bin")  # the Trainer's pickle, which no loader opens
    prepare(s, **{key: str(folder)})


def test_an_adapter_in_a_subfolder_is_looked_at_there(ws):
    adapter = files(ws / "shared" / "a", "adapter_model.safetensors", "sub/adapter_model.bin")
    e = refused(Settings(workspace=ws), adapter_name_or_path=adapter, adapter_folder="sub")
    assert e[("config", "adapter_name_or_path")]["code"] == "LF017"


def test_a_hub_snapshot_of_bin_weights_is_refused(ws, tmp_path):
    snap = tmp_path / "hf" / "hub" / "models--org--old" / "snapshots" / "abc"
    files(snap, "config.json", "pytorch_model.bin")
    e = refused(Settings(workspace=ws), model_name_or_path="org/old")[("config", "model_name_or_path")]
    assert e["code"] == "LF017" and str(snap / "pytorch_model.bin") in e["msg"]


def test_what_tunedecks_runs_saved_is_loaded_as_their_own(ws):
    s = Settings(workspace=ws)
    out = ws / "runs" / "000003-done" / "output"
    files(out, "adapter_model.bin", *(f"checkpoint-7/{n}" for n in DEEPSPEED_CHECKPOINT))
    files(out, "checkpoint-7/pytorch_model.bin", "checkpoint-7/optimizer.pt")
    prepare(s, adapter_name_or_path=str(out))
    prepare(s, adapter_name_or_path=str(out / "checkpoint-7"), model_name_or_path=str(out / "checkpoint-7"))
    prepare(s, resume_from_checkpoint=str(out / "checkpoint-7"))
    # Not what the Trainer saves: the output folder itself is no checkpoint, and anything else in a run
    # folder may have come from outside (a cache_dir the run downloaded into).
    assert ("config", "resume_from_checkpoint") in refused(s, resume_from_checkpoint=str(out))
    hub_copy = files(out / "hf" / "snap", "pytorch_model.bin")
    assert ("config", "model_name_or_path") in refused(s, model_name_or_path=hub_copy)
    # A checkpoint folder that a link leads elsewhere is judged where it leads.
    foreign = files(ws / "shared" / "ckpt", *DEEPSPEED_CHECKPOINT)
    (out / "checkpoint-9").symlink_to(foreign)
    assert ("config", "resume_from_checkpoint") in refused(
        s, resume_from_checkpoint=str(out / "checkpoint-9")
    )


def test_resume_from_a_parents_deepspeed_checkpoint_is_accepted(app_factory, assets):
    """Through the API: resume and a submit that names a tunedeck run's checkpoint load it; a foreign
    checkpoint, or one a link in the parent's output leads to, is a 422 at the key."""
    app = app_factory()
    parent = app.submit({"name": "zero3", "gpus": 0, "config": demo_config(assets)})
    out = Path(parent["output_dir"])
    files(out / "checkpoint-2", *DEEPSPEED_CHECKPOINT, "rng_state.pth", "scheduler.pt")
    r = app.api.post(f"/api/jobs/{parent['id']}/resume", json={})
    assert r.status_code == 201, r.text
    shown = app.api.get(f"/api/jobs/{r.json()['id']}/config").json()["train_yaml"]
    assert f"resume_from_checkpoint: {out / 'checkpoint-2'}\n" in shown
    again = demo_config(assets, resume_from_checkpoint=str(out / "checkpoint-2"))
    assert app.api.post("/api/jobs", json={"name": "again", "gpus": 0, "config": again}).status_code == 201

    foreign = files(app.workspace / "shared" / "ckpt", *DEEPSPEED_CHECKPOINT)
    (out / "checkpoint-3").symlink_to(foreign)
    for path in (foreign, str(out / "checkpoint-3")):
        bad = demo_config(assets, resume_from_checkpoint=path)
        r = app.api.post("/api/jobs", json={"name": "bad", "gpus": 0, "config": bad})
        assert r.status_code == 422, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["config", "resume_from_checkpoint"] and d["code"] == "LF017"
        assert "weights_only=False" in d["msg"]
    # The checkpoints listing passes a linked folder over, so resume cannot name it either.
    assert (
        app.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": "checkpoint-3"}).status_code
        == 404
    )

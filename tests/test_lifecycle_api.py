"""The lifecycle routes on the app itself (launches held): clone, resume, tags and notes, search,
delete, file and archive downloads. Real runs of them: tests/integration/test_lifecycle.py."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.utils.servers import demo_config


@pytest.fixture
def app(app_factory):
    return app_factory()


def made(app, assets, name: str, **overrides) -> dict:
    return app.submit({"name": name, "config": demo_config(assets, **overrides), "gpus": 0})


def placed(app, created: dict) -> tuple:
    """A new job's place in line as the create route answered it, checked against the job's own route."""
    row = app.api.get(f"/api/jobs/{created['id']}").json()
    assert (created["queue_position"], created["waiting_for"]) == (row["queue_position"], row["waiting_for"])
    return created["queue_position"], created["waiting_for"]


def ids(app, **params) -> list[int]:
    r = app.api.get("/api/jobs", params=params)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]]


def test_clone_takes_overrides_and_refuses_like_a_submit(app, assets):
    parent = made(app, assets, "base", warmup_steps=3)
    r = app.api.post(
        f"/api/jobs/{parent['id']}/clone",
        json={"overrides": {"learning_rate": 0.001, "warmup_steps": None}, "name": "lower lr"},
    )
    assert r.status_code == 201, r.text
    clone = r.json()
    assert (clone["parent_id"], clone["name"], clone["status"]) == (parent["id"], "lower lr", "queued")
    assert placed(app, clone) == (2, "launches paused")  # placed in the queue like a submitted job
    text = app.api.get(f"/api/jobs/{clone['id']}/config").json()["train_yaml"]
    assert "learning_rate: 0.001\n" in text and "warmup_steps" not in text
    assert app.api.get(f"/api/jobs/{parent['id']}").json()["parent_id"] is None

    bad = app.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"learning_rat": 1, "seed": 2}})
    assert bad.status_code == 422
    assert [d["loc"] for d in bad.json()["detail"]] == [["body", "overrides", "learning_rat"]]
    as_submit = app.api.post("/api/jobs", json={"name": "x", "config": demo_config(assets, max_steps=-3)})
    as_clone = app.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"max_steps": -3}})
    assert as_clone.status_code == as_submit.status_code == 422
    assert as_clone.json()["detail"] == as_submit.json()["detail"]
    outside = app.api.post(f"/api/jobs/{parent['id']}/clone", json={"overrides": {"dataset_dir": "/etc"}})
    assert outside.status_code == 422 and outside.json()["detail"][0]["loc"] == ["config", "dataset_dir"]
    assert app.api.post(f"/api/jobs/{parent['id']}/clone", json={"overides": {}}).status_code == 422
    assert app.api.post("/api/jobs/999/clone", json={}).status_code == 404
    # The advice "rerun with NCCL_DEBUG=INFO" can be followed: env, priority and GPUs change with the clone.
    parent_env = app.submit(
        {
            "name": "env",
            "config": demo_config(assets),
            "gpus": 0,
            "env": {"OMP_NUM_THREADS": "2", "NCCL_DEBUG": "WARN"},
        }
    )
    r = app.api.post(
        f"/api/jobs/{parent_env['id']}/clone",
        json={"env": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": None}, "priority": 3},
    )
    assert r.status_code == 201, r.text
    assert r.json()["priority"] == 3
    assert app.api.get(f"/api/jobs/{r.json()['id']}/config").json()["env"] == {"NCCL_DEBUG": "INFO"}
    refused = app.api.post(f"/api/jobs/{parent_env['id']}/clone", json={"env": {"LD_PRELOAD": "/tmp/x.so"}})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["env", "LD_PRELOAD"], (
        refused.text
    )
    log = '{"current_steps": 1, "total_steps": 1, "loss": 1.0}\n'
    imported = app.api.post("/api/runs/import", files={"trainer_log": ("trainer_log.jsonl", log)}).json()
    for verb in ("clone", "resume"):
        r = app.api.post(f"/api/jobs/{imported['id']}/{verb}", json={})
        assert r.status_code == 409 and "imported run" in r.json()["detail"], (verb, r.text)


def test_resume_from_the_newest_or_a_named_checkpoint(app, assets):
    parent = made(app, assets, "stopped")
    r = app.api.post(f"/api/jobs/{parent['id']}/resume")
    assert r.status_code == 409 and "no resumable checkpoint" in r.json()["detail"]
    out = Path(parent["output_dir"])
    for step, files in ((2, ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json")), (4, ())):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        for f in (*files, "scheduler.pt", "rng_state.pth"):
            (out / f"checkpoint-{step}" / f).write_bytes(b"x" * 10)
    (out / "checkpoint-9").write_text("a file, not a folder")
    cps = app.api.get(f"/api/jobs/{parent['id']}/checkpoints").json()
    assert [(c["name"], c["resumable"]) for c in cps] == [("checkpoint-2", True), ("checkpoint-4", False)]
    assert cps[0]["holds"] == ["adapter", "optimizer", "scheduler", "rng", "trainer_state"]
    assert cps[0]["bytes"] == 50

    child = app.api.post(f"/api/jobs/{parent['id']}/resume", json={})
    assert child.status_code == 201, child.text
    child = child.json()
    assert child["parent_id"] == parent["id"] and child["name"] == parent["name"]
    assert placed(app, child)[0] == 2
    text = app.api.get(f"/api/jobs/{child['id']}/config").json()["train_yaml"]
    assert f"resume_from_checkpoint: {out / 'checkpoint-2'}\n" in text
    assert (
        app.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": "checkpoint-4"}).status_code
        == 409
    )
    assert (
        app.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": "checkpoint-7"}).status_code
        == 404
    )
    for sneaky in ("../../other", "checkpoint-2/..", "/etc"):
        r = app.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": sneaky})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "checkpoint"], sneaky


def test_tags_notes_and_search(app, assets):
    a = made(app, assets, "lora rank 8")
    b = made(app, assets, "lora rank 16")
    c = made(app, assets, "full ft")
    app.api.patch(f"/api/jobs/{c['id']}", json={"notes": "warmup 100% of epoch_1"})
    r = app.api.patch(
        f"/api/jobs/{a['id']}", json={"tags": ["sweep", "keep", "sweep"], "notes": "The Baseline"}
    )
    assert r.status_code == 200 and (r.json()["tags"], r.json()["notes"]) == (
        ["sweep", "keep"],
        "The Baseline",
    )
    app.api.patch(f"/api/jobs/{b['id']}", json={"tags": ["sweep"]})
    assert app.api.patch(f"/api/jobs/{b['id']}", json={"notes": "n"}).json()["tags"] == ["sweep"]  # kept
    for bad in ({"tags": ["has space"]}, {"tags": "sweep"}, {"owner": "me"}, {"tags": ["x"] * 21}):
        assert app.api.patch(f"/api/jobs/{a['id']}", json=bad).status_code == 422, bad

    assert ids(app, tag="sweep") == [b["id"], a["id"]]
    assert ids(app, tag="keep") == [a["id"]]
    assert ids(app, tag="swee") == []
    assert ids(app, q="baseline") == [a["id"]]
    assert ids(app, q="LORA") == [b["id"], a["id"]]
    # % and _ are characters here, not LIKE wildcards.
    assert ids(app, q="100%") == ids(app, q="%") == ids(app, q="_") == [c["id"]]
    assert ids(app, q="0%_") == ids(app, q="of_epoch") == []
    assert ids(app, q="rank", tag="keep") == [a["id"]]
    assert ids(app, status="queued", limit=1) == [c["id"]]
    assert ids(app, owner="nobody") == []
    assert ids(app, created_after=b["created_at"]) == [c["id"], b["id"]]
    assert ids(app, created_before=b["created_at"]) == [a["id"]]
    assert ids(app, created_after="2999-01-01T00:00:00Z") == []
    assert ids(app, created_before="2999-01-01T00:00:00+02:00") == [c["id"], b["id"], a["id"]]
    r = app.api.get("/api/jobs", params={"tags": "keep", "stat": "queued"})
    assert r.status_code == 422
    assert sorted(d["loc"][1] for d in r.json()["detail"]) == ["stat", "tags"]
    assert app.api.get("/api/jobs", params={"created_after": "yesterday"}).status_code == 422


def test_delete_ended_jobs_only_files_by_choice(app, assets):
    keep, remove = made(app, assets, "keep files"), made(app, assets, "remove files")
    r = app.api.delete(f"/api/jobs/{keep['id']}")
    assert r.status_code == 409 and "cancel it first" in r.json()["detail"]
    for job in (keep, remove):
        assert app.api.post(f"/api/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    assert app.api.delete(f"/api/jobs/{keep['id']}", params={"files": "gone"}).status_code == 422
    assert app.api.delete(f"/api/jobs/{keep['id']}", params={"file": "remove"}).status_code == 422
    assert app.api.delete(f"/api/jobs/{keep['id']}").json() == {"id": keep["id"], "files": "keep"}
    assert app.api.get(f"/api/jobs/{keep['id']}").status_code == 404
    assert Path(keep["run_dir"]).is_dir()
    assert app.api.delete(f"/api/jobs/{remove['id']}", params={"files": "remove"}).status_code == 200
    assert not Path(remove["run_dir"]).exists()
    assert app.api.delete(f"/api/jobs/{remove['id']}").status_code == 404


def test_files_are_confined_and_ranged_archives_stream(app, assets):
    job = made(app, assets, "artifacts")
    out = Path(job["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    weights = bytes(range(256)) * 4000
    (out / "adapter_model.safetensors").write_bytes(weights)
    (out / "adapter_config.json").write_text('{"r": 8}')
    (out / "trainer_log.jsonl").write_text("{}\n")
    (out / "checkpoint-5").mkdir()
    (out / "checkpoint-5" / "optimizer.pt").write_bytes(b"o" * 513)
    (out / "leak").symlink_to(Path(job["run_dir"]) / "train.yaml")
    base = f"/api/jobs/{job['id']}"

    r = app.api.get(f"{base}/files/checkpoint-5/optimizer.pt")
    assert r.status_code == 200 and r.content == b"o" * 513
    r = app.api.get(f"{base}/files/adapter_model.safetensors", headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.content == weights[1000:2000]
    assert r.headers["content-range"] == f"bytes 1000-1999/{len(weights)}"
    r = app.api.get(f"{base}/files/adapter_model.safetensors", headers={"Range": "bytes=-10"})
    assert r.status_code == 206 and r.content == weights[-10:]
    r = app.api.get(f"{base}/files/adapter_config.json", headers={"Range": "bytes=100-200"})
    assert r.status_code == 416
    for sneaky in (
        "leak",
        "..%2Ftrain.yaml",
        "..%2F..%2F..%2Ftunedeck.db",
        "%2Fetc%2Fpasswd",
        "checkpoint-5",
        "nope",
    ):
        assert app.api.get(f"{base}/files/{sneaky}").status_code == 404, sneaky

    r = app.api.get(f"{base}/archive")
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert f'filename="job{job["id"]}-adapter.zip"' in r.headers["content-disposition"]
    z = zipfile.ZipFile(io.BytesIO(r.content))
    prefix = f"job{job['id']}-adapter/"
    assert sorted(z.namelist()) == [prefix + "adapter_config.json", prefix + "adapter_model.safetensors"]
    assert z.read(prefix + "adapter_model.safetensors") == weights
    r = app.api.get(f"{base}/archive", params={"what": "checkpoint-5", "format": "tar"})
    with tarfile.open(fileobj=io.BytesIO(r.content)) as t:
        (member,) = t.getmembers()
        assert member.name == f"job{job['id']}-checkpoint-5/optimizer.pt"
        assert t.extractfile(member).read() == b"o" * 513
    r = app.api.get(f"{base}/archive", params={"what": "output", "format": "tar"})
    with tarfile.open(fileobj=io.BytesIO(r.content)) as t:
        names = {m.name.split("/", 1)[1] for m in t.getmembers()}
    assert names == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "trainer_log.jsonl",
        "checkpoint-5/optimizer.pt",
    }
    assert app.api.get(f"{base}/archive", params={"what": "../output"}).status_code == 422
    assert app.api.get(f"{base}/archive", params={"what": "checkpoint-6"}).status_code == 404
    assert app.api.get(f"{base}/archive", params={"format": "rar"}).status_code == 422
    assert app.api.get(f"{base}/archive", params={"whut": "adapter"}).status_code == 422
    (out / "adapter_model.safetensors").unlink()
    assert app.api.get(f"{base}/archive").status_code == 404


def test_a_submit_names_its_parent_which_must_exist(app, assets):
    parent = made(app, assets, "first try")
    spec = {"name": "second try", "config": demo_config(assets), "gpus": 0, "parent_id": parent["id"]}
    child = app.api.post("/api/jobs", json=spec)
    assert child.status_code == 201, child.text
    assert child.json()["parent_id"] == parent["id"]
    assert app.api.get(f"/api/jobs/{child.json()['id']}").json()["parent_id"] == parent["id"]
    # Lineage is the row's, not the spec's: a clone of the child is the child's, not the first try's.
    clone = app.api.post(f"/api/jobs/{child.json()['id']}/clone", json={}).json()
    assert clone["parent_id"] == child.json()["id"]
    assert app.api.get(f"/api/jobs/{parent['id']}").json()["parent_id"] is None

    # A parent that is no job is refused at its field, with every other problem of the spec.
    r = app.api.post(
        "/api/jobs", json={**spec, "parent_id": 9999, "config": demo_config(assets, max_steps=-3)}
    )
    assert r.status_code == 422, r.text
    locs = {tuple(d["loc"]): d["msg"] for d in r.json()["detail"]}
    assert locs[("parent_id",)] == "job 9999 not found" and ("config", "max_steps") in locs
    for bad in (0, -1, "one", 2**63):
        r = app.api.post("/api/jobs", json={**spec, "parent_id": bad})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "parent_id"], (bad, r.text)
    assert len(ids(app)) == 3  # nothing refused was stored


def test_a_parent_is_one_the_caller_may_read(app_factory, assets):
    # Writes open, reads closed: a submit may not learn of a job through its parent_id.
    app = app_factory(TUNEDECK_OPEN_READ="false")
    parent = made(app, assets, "hidden")
    r = app.api.post(
        "/api/jobs",
        json={"name": "peek", "config": demo_config(assets), "gpus": 0, "parent_id": parent["id"]},
    )
    assert r.status_code == 403 and "parent_id" in r.json()["detail"], r.text

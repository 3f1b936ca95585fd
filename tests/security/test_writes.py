"""Where a job's trainer may write: every key it writes, of both captured tables, lands in the job's
own run folder (or its folder under TUNEDECK_SCRATCH_ROOT); the workspace's database, another job's
run folder and tunedeck's own files in the run folder are refused at the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.utils.datasets import add_dataset
from tests.utils.servers import demo_config
from tunedeck.checks import reach, writes
from tunedeck.checks.spec import SpecError
from tunedeck.checks.submission import Node, Submission, resolve
from tunedeck.checks.tables import lf_table
from tunedeck.config import Settings
from tunedeck.schemas import JobSpec

# The keys of the report: the table walk must find them written, and the reads not.
REPORTED_LF = {"tokenized_path", "logging_dir", "profiler_output_dir", "export_dir", "offload_folder"}
REPORTED_DS = {
    ("flops_profiler", "output_file"),
    ("tensorboard", "output_path"),
    ("csv_monitor", "output_path"),
    ("zero_optimization", "offload_param", "nvme_path"),
    ("zero_optimization", "offload_optimizer", "nvme_path"),
}
READS = {"model_name_or_path", "adapter_name_or_path", "dataset_dir", "resume_from_checkpoint", "media_dir"}


def ds_write_locs() -> list[tuple[str, ...]]:
    return [loc for loc in reach.ds_path_keys() if writes.is_write(writes.ds_helps().get(loc))]


# Every place the trainer writes: ("config", key) or ("deepspeed", section, ..., key).
TARGETS = [("config", k) for k in sorted(reach.lf_write_keys())] + [
    ("deepspeed", *loc) for loc in ds_write_locs()
]


def ids(target: tuple[str, ...]) -> str:
    return ".".join(target)


@pytest.fixture
def ws(tmp_path) -> Path:
    ws = tmp_path / "ws"
    (ws / "models" / "m").mkdir(parents=True)
    add_dataset(ws / "data")  # the "d" every spec names
    (ws / "tunedeck.db").write_bytes(b"SQLite format 3\0")
    (ws / "tunedeck.db-wal").write_bytes(b"")
    other = ws / "runs" / "000001-other" / "output"  # another user's job
    other.mkdir(parents=True)
    (other / "trainer_log.jsonl").write_text("{}\n")
    return ws


BASE = {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen", "finetuning_type": "lora"}


def spec_with(target: tuple[Any, ...], value: Any) -> JobSpec:
    if target[0] == "config":
        return JobSpec(name="t", config={**BASE, target[1]: value})
    ds: dict = {}
    node = ds
    for part in target[1:-1]:
        node = node.setdefault(part, {})
    node[target[-1]] = value
    return JobSpec(name="t", config=BASE, deepspeed=ds)


def prepare(spec: JobSpec, settings: Settings) -> Submission:
    return resolve(spec, settings, Node()).checked()


def refused(spec: JobSpec, settings: Settings) -> dict[tuple, dict]:
    with pytest.raises(SpecError) as e:
        prepare(spec, settings)
    return {tuple(x["loc"]): x for x in e.value.errors}


def rendered(p: Submission, run_dir: Path, target: tuple[Any, ...]) -> Any:
    """The value at `target` in the train.yaml / ds_config.json rendered into `run_dir`."""
    text, ds = p.render(run_dir=run_dir)
    node = yaml.safe_load(text) if target[0] == "config" else json.loads(ds)
    for part in target[1:]:
        node = node[part]
    return node


def test_the_table_walk_finds_the_written_keys_by_their_help():
    assert REPORTED_LF <= set(reach.lf_write_keys()), REPORTED_LF - set(reach.lf_write_keys())
    assert REPORTED_DS <= set(ds_write_locs())
    assert not READS & set(reach.lf_write_keys())
    # "Path to save or load the tokenized datasets": written only while absent.
    assert [k for k, absent in reach.lf_write_keys().items() if absent] == ["tokenized_path"]
    # Each key was found by what its help says, not by a list.
    args = lf_table()["args"]
    assert all(writes.WRITE_HELP.search(args[k]["help"]) for k in reach.lf_write_keys())
    assert writes.ds_subfolder_keys() == {
        ("tensorboard", "job_name"): "output_path",
        ("csv_monitor", "job_name"): "output_path",
    }


@pytest.mark.parametrize("target", TARGETS, ids=ids)
def test_every_written_key_lands_in_the_jobs_own_run_folder(ws, tmp_path, target):
    s = Settings(workspace=ws)
    for bad in (
        str(ws / "tunedeck.db"),  # DeepSpeed's profile opens its file with "w": the server's database
        str(ws / "tunedeck.db-wal"),
        str(ws / "runs" / "000001-other" / "output" / "x"),  # another job's files and archive
        str(ws / "logs"),  # the workspace itself
        str(tmp_path / "elsewhere"),
        "../000001-other/output",
        "~/x",
        "output/checkpoint-1/x",  # what later jobs load as tunedeck's own (resume, adapters)
        "output",
        "output/adapter_model.bin",  # beside the weights it saves there
        "runner.json",  # the runner's and the server's files in the run folder
        "outbox.jsonl",
        "runner.rank1.json",
        "output/trainer_log.jsonl",
    ):
        errs = refused(spec_with(target, bad), s)
        assert target in errs, (bad, errs)
    p = prepare(spec_with(target, "x/y"), s)
    run_dir = ws / "runs" / "000002-t"
    assert rendered(p, run_dir, target) == str(run_dir / "x" / "y")
    assert rendered(p, Path("<run folder>"), target) == "<run folder>/x/y"  # the preview's
    errs = refused(spec_with(target, str(tmp_path / "scratch" / "swap")), s)
    assert "TUNEDECK_SCRATCH_ROOT" in errs[target]["msg"]
    # An absolute path inside the scratch root lands in the job's own folder there.
    scratch = Settings(workspace=ws, scratch_root=tmp_path / "scratch")
    p = prepare(spec_with(target, str(tmp_path / "scratch" / "swap")), scratch)
    assert rendered(p, run_dir, target) == str(tmp_path / "scratch" / "000002-t" / "swap")
    assert target in refused(spec_with(target, str(ws / "tunedeck.db")), scratch)


def test_no_key_reaches_the_servers_own_files(ws, tmp_path):
    """Read or written, no path key of either table may name the database or the admin token."""
    token = tmp_path / "admin-token.json"  # named so that `deepspeed` would read it as its file
    token.write_text("tdk_secret")
    s = Settings(workspace=ws, allowed_roots=[tmp_path], admin_token_file=token)
    targets = [("config", k) for k in reach.lf_path_keys() if k not in reach.OWNED]
    targets += [("deepspeed", *loc) for loc in reach.ds_path_keys()]
    for target in targets:
        for own in (ws / "tunedeck.db", token):
            errs = refused(spec_with(target, str(own)), s)
            assert target in errs, (target, own, errs)
    errs = refused(JobSpec(name="t", config=BASE, deepspeed=str(token)), s)
    assert "server's own files" in errs[("deepspeed",)]["msg"]


def test_tokenized_data_is_read_where_it_is_and_written_only_in_the_jobs_folders(ws, tmp_path):
    """LLaMA-Factory loads `tokenized_path` when the folder holds something and saves there otherwise."""
    s = Settings(workspace=ws)
    done = ws / "runs" / "000001-other" / "tok"  # another job's tokenized data: read, nothing written
    done.mkdir()
    (done / "dataset_dict.json").write_text("{}")
    assert prepare(spec_with(("config", "tokenized_path"), str(done)), s).config["tokenized_path"] == str(
        done
    )
    (ws / "runs" / "000001-other" / "empty").mkdir()
    for absent in (ws / "runs" / "000001-other" / "empty", ws / "tok"):
        errs = refused(spec_with(("config", "tokenized_path"), str(absent)), s)
        assert "does not hold anything yet" in errs[("config", "tokenized_path")]["msg"]
    p = prepare(spec_with(("config", "tokenized_path"), "tok"), s)
    assert rendered(p, ws / "runs" / "000002-t", ("config", "tokenized_path")) == str(
        ws / "runs" / "000002-t" / "tok"
    )


def test_a_folder_deepspeed_makes_inside_a_written_path_stays_inside(ws):
    s = Settings(workspace=ws)
    for monitor in ("tensorboard", "csv_monitor"):
        loc = ("deepspeed", monitor, "job_name")
        for output_path, job_name in (
            ("tb", "../../000001-other"),
            ("tb", "/etc"),
            ("", "output/checkpoint-3"),  # the trainer's own save
            ("", "train.log"),  # no output_path: inside the run folder itself
            ("", "../x"),
        ):
            section = {"enabled": True, "output_path": output_path, "job_name": job_name}
            spec = JobSpec(name="t", config=BASE, deepspeed={monitor: section})
            assert loc in refused(spec, s), (output_path, job_name)
        section = {"enabled": True, "output_path": "output/tb", "job_name": "run1"}
        spec = JobSpec(name="t", config=BASE, deepspeed={monitor: section})
        _, ds = prepare(spec, s).render(run_dir=ws / "runs" / "000002-t")
        assert json.loads(ds)[monitor] == {
            **section,
            "output_path": str(ws / "runs" / "000002-t" / "output" / "tb"),
        }


def test_a_submitted_job_writes_only_in_its_own_folders(app_factory, assets, tmp_path):
    """Through the API: the reported escapes are a 422 at the key, and the paths a created job writes
    are placed in its run folder (and its scratch folder) once its id is known."""
    scratch = tmp_path / "scratch"
    app = app_factory(TUNEDECK_SCRATCH_ROOT=str(scratch))
    db = app.workspace / "tunedeck.db"
    profile = {"flops_profiler": {"enabled": True, "output_file": str(db)}}
    r = app.api.post(
        "/api/jobs", json={"name": "p", "gpus": 0, "config": demo_config(assets), "deepspeed": profile}
    )
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["deepspeed", "flops_profiler", "output_file"]]
    other = app.submit({"name": "other", "gpus": 0, "config": demo_config(assets)})
    into = str(Path(other["output_dir"]) / "tb")
    for key in ("logging_dir", "profiler_output_dir", "tokenized_path"):
        r = app.api.post(
            "/api/jobs", json={"name": "x", "gpus": 0, "config": demo_config(assets, **{key: into})}
        )
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["config", key], (key, r.text)

    ds = {
        "tensorboard": {"enabled": True, "output_path": "output/tb"},
        "flops_profiler": {"enabled": True, "output_file": "flops.txt"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": str(scratch / "swap")},
        },
    }
    config = demo_config(assets, logging_dir="logs", tokenized_path="tok")
    job = app.submit({"name": "mine", "gpus": 0, "config": config, "deepspeed": ds})
    shown = app.api.get(f"/api/jobs/{job['id']}/config").json()
    run_dir = Path(shown["run_dir"])
    assert run_dir.parent == app.workspace / "runs" and run_dir.name.startswith(f"{job['id']:06d}-")
    ran = yaml.safe_load((run_dir / "train.yaml").read_text())
    assert ran == yaml.safe_load(shown["train_yaml"])
    assert (ran["logging_dir"], ran["tokenized_path"]) == (str(run_dir / "logs"), str(run_dir / "tok"))
    written = json.loads((run_dir / "ds_config.json").read_text())
    assert written["tensorboard"]["output_path"] == str(run_dir / "output" / "tb")
    assert written["flops_profiler"]["output_file"] == str(run_dir / "flops.txt")
    own_scratch = scratch / run_dir.name
    assert written["zero_optimization"]["offload_param"]["nvme_path"] == str(own_scratch / "swap")
    assert own_scratch.is_dir() and own_scratch.stat().st_mode & 0o777 == 0o700
    # The spec is kept as submitted: a clone places the same keys in the clone's own folders.
    clone = app.api.post(f"/api/jobs/{job['id']}/clone", json={})
    assert clone.status_code == 201, clone.text
    again = app.api.get(f"/api/jobs/{clone.json()['id']}/config").json()
    assert yaml.safe_load(again["train_yaml"])["logging_dir"] == str(Path(again["run_dir"]) / "logs")

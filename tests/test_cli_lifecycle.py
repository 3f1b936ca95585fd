"""The lifecycle and data verbs of the CLI, as subprocesses against one real server with stand-in trainers."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import yaml

from tests.test_cli import cli, until
from tests.utils.servers import demo_config
from tests.utils.standin import release, training_env

ENDED = ("succeeded", "failed", "cancelled")


def ok(r) -> str:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def test_cli_lifecycle_verbs(server_factory, assets, tmp_path):
    server = server_factory(
        TUNEDECK_CPU_SLOTS="2",
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_PAGE_LIMIT="2",  # `jobs` must follow the cursor to list them all
        TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")),
    )
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(server.workspace), "TUNEDECK_SERVER_URL": server.url}
    config = demo_config(assets)

    # import: an outside run, with grad_norm in its lines.
    outside = tmp_path / "outside"
    outside.mkdir()
    lines = [
        {"current_steps": s, "total_steps": 3, "loss": 3.0 - s / 10, "lr": 1e-4, "grad_norm": 0.5 + s}
        for s in (1, 2, 3)
    ]
    (outside / "trainer_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    imported = int(ok(cli("import", str(outside), "--name", "outside run", env=env)).split()[3])
    points = json.loads(ok(cli("metrics", str(imported), "--json", env=env)))
    assert [(p["step"], p["loss"], p["grad_norm"]) for p in points] == [
        (x["current_steps"], x["loss"], x["grad_norm"]) for x in lines
    ]
    assert "grad_norm" in ok(cli("metrics", str(imported), env=env)).splitlines()[0]
    assert isinstance(json.loads(ok(cli("alerts", str(imported), "--json", env=env))), list)

    # A finished stand-in job given an adapter and a checkpoint (the stand-in writes no output).
    done = server.submit({"name": "base", "config": config, "gpus": 0})
    done = server.wait(done["id"], ENDED)
    out = Path(done["output_dir"])
    (out / "checkpoint-3").mkdir(parents=True)
    for name, data in {
        "adapter_model.safetensors": b"weights" * 100,
        "adapter_config.json": b'{"r": 8}',
        "trainer_log.jsonl": b"",
        "checkpoint-3/adapter_model.safetensors": b"w",
        "checkpoint-3/optimizer.pt": b"o",
        "checkpoint-3/trainer_state.json": b"{}",
    }.items():
        (out / name).write_bytes(data)
    listed = {f["path"] for f in json.loads(ok(cli("files", str(done["id"]), "--json", env=env)))}
    assert {"adapter_model.safetensors", "checkpoint-3/optimizer.pt"} <= listed
    (cp,) = json.loads(ok(cli("checkpoints", str(done["id"]), "--json", env=env)))
    assert cp["name"] == "checkpoint-3" and cp["resumable"]
    assert "trainer_state" in cp["holds"] and "optimizer" in cp["holds"]
    ok(cli("download", str(done["id"]), "adapter_config.json", "-o", str(tmp_path / "cfg.json"), env=env))
    assert (tmp_path / "cfg.json").read_bytes() == b'{"r": 8}'
    said = ok(cli("download", str(done["id"]), "-o", str(tmp_path), env=env))
    archive = tmp_path / f"job{done['id']}-adapter.zip"
    assert str(archive) in said
    names = zipfile.ZipFile(io.BytesIO(archive.read_bytes())).namelist()
    prefix = f"job{done['id']}-adapter/"
    assert sorted(names) == [prefix + "adapter_config.json", prefix + "adapter_model.safetensors"]
    missing = cli("download", str(done["id"]), "nope.bin", "-o", str(tmp_path / "x"), env=env)
    assert missing.returncode == 1 and "404" in missing.stderr

    # resume, clone, config, compare.
    resumed = int(ok(cli("resume", str(done["id"]), env=env)).split()[3])
    shown = yaml.safe_load(ok(cli("config", str(resumed), env=env)))
    assert shown["resume_from_checkpoint"] == str(out / "checkpoint-3")
    as_json = json.loads(ok(cli("config", str(resumed), "--json", env=env)))
    assert yaml.safe_load(as_json["train_yaml"]) == shown
    cloned = int(
        ok(cli("clone", str(done["id"]), "--set", "max_steps=7", "--set", "warmup_steps=", env=env)).split()[
            3
        ]
    )
    shown = yaml.safe_load(ok(cli("config", str(cloned), env=env)))
    assert shown["max_steps"] == 7 and "warmup_steps" not in shown
    bad = cli("clone", str(done["id"]), "--set", "max_stepz=7", env=env)
    assert bad.returncode == 1 and "body.overrides.max_stepz" in bad.stderr
    compared = json.loads(ok(cli("compare", str(done["id"]), str(cloned), "--json", env=env)))
    assert compared["differ"]["max_steps"] == {str(done["id"]): config["max_steps"], str(cloned): 7}

    # tag and search.
    ok(cli("tag", str(cloned), "keep", "sweep", env=env))
    tagged = json.loads(
        ok(cli("tag", str(cloned), "--remove", "sweep", "--notes", "the short one", "--json", env=env))
    )
    assert (tagged["tags"], tagged["notes"]) == (["keep"], "the short one")
    assert [j["id"] for j in json.loads(ok(cli("jobs", "--tag", "keep", "--json", env=env)))] == [cloned]
    assert [j["id"] for j in json.loads(ok(cli("jobs", "--q", "SHORT", "--json", env=env)))] == [cloned]

    # rm: never a running job; the files go only when asked.
    held = server.submit({"name": "held", "config": config, "gpus": 0})
    until(lambda: any(x["text"] == "first line" for x in server.all(held["id"], "logs")), "the held trainer")
    refused = cli("rm", str(held["id"]), env=env)
    assert refused.returncode == 1 and "409" in refused.stderr
    release(Path(held["run_dir"]))
    for job_id in (resumed, cloned, held["id"]):
        server.wait(job_id, ENDED)
    logged = [json.loads(x) for x in ok(cli("logs", str(held["id"]), "--json", env=env)).splitlines()]
    assert [x["text"] for x in logged if x["stream"] == "stdout"] == ["first line", "last line"]
    every = json.loads(ok(cli("jobs", "--json", env=env)))
    assert [j["id"] for j in every] == sorted(
        (imported, done["id"], resumed, cloned, held["id"]), reverse=True
    )
    assert len(ok(cli("jobs", env=env)).splitlines()) == len(every)
    ok(cli("rm", str(held["id"]), "--files", env=env))
    assert not Path(held["run_dir"]).exists()
    ok(cli("rm", str(cloned), env=env))
    assert Path(server.api.get(f"/api/jobs/{resumed}").json()["run_dir"]).is_dir()
    assert server.api.get(f"/api/jobs/{cloned}").status_code == 404

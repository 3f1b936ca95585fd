"""Jobs side by side (`GET /api/compare`, `tunedeck compare`), over imported runs, the app in process."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.utils.factories import create_import
from tunedeck.cli.jobs import comparison

# Two dataset folders that share a long prefix: a table that cuts values would print them alike.
DATA = "/data/team/instruction-tuning/2026-11"


def run_folder(folder: Path, *, dataset_dir: str, lr: float, eval_loss: float | None) -> Path:
    (folder / "output").mkdir(parents=True)
    lines = [{"current_steps": k, "total_steps": 4, "loss": 2.0 - k / 10, "lr": lr} for k in (1, 2, 3, 4)]
    if eval_loss is not None:  # as LLaMA-Factory logs an evaluation: eval_loss and no loss
        lines.append({"current_steps": 4, "total_steps": 4, "eval_loss": eval_loss})
    (folder / "output" / "trainer_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"dataset": "alpaca", "dataset_dir": dataset_dir, "learning_rate": lr, "output_dir": str(folder)}
    (folder / "train.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_compare_answers_whole_values_and_each_jobs_last_eval_loss(app_factory, tmp_path):
    app = app_factory()
    a = create_import(
        app.engine,
        app.settings,
        run_folder(tmp_path / "a", dataset_dir=f"{DATA}/cleaned-v1", lr=1e-4, eval_loss=1.25),
        name="a",
    )
    b = create_import(
        app.engine,
        app.settings,
        run_folder(tmp_path / "b", dataset_dir=f"{DATA}/cleaned-v2", lr=2e-4, eval_loss=None),
        name="b",
    )
    r = app.api.get("/api/compare", params={"jobs": f"{b.id},{a.id}"})
    assert r.status_code == 200, r.text
    found = r.json()
    assert [j["id"] for j in found["jobs"]] == [b.id, a.id]  # in the order asked
    assert found["differ"] == {
        "dataset_dir": {str(a.id): f"{DATA}/cleaned-v1", str(b.id): f"{DATA}/cleaned-v2"},
        "learning_rate": {str(a.id): 1e-4, str(b.id): 2e-4},
    }  # output_dir always differs and is left out; dataset is the same
    last = {j["id"]: j["last"] for j in found["jobs"]}
    # The last loss is the last training line's, the eval loss the evaluation's (a line of its own).
    assert last[a.id]["eval_loss"] == 1.25 and abs(last[a.id]["loss"] - 1.6) < 1e-9
    assert last[a.id]["step"] == 4 and last[b.id]["eval_loss"] is None

    table = comparison(found)
    assert table[0].split() == ["job", str(b.id), "job", str(a.id)]
    (row,) = [x for x in table if x.startswith("dataset_dir")]
    assert row.split() == ["dataset_dir", f"{DATA}/cleaned-v2", f"{DATA}/cleaned-v1"]
    (row,) = [x for x in table if x.startswith("last eval_loss")]
    assert row.split() == ["last", "eval_loss", "1.25"]

    for bad in ("1", f"{a.id},{a.id}", "x,y", f"{a.id},"):
        r = app.api.get("/api/compare", params={"jobs": bad})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "jobs"], (bad, r.text)
    r = app.api.get("/api/compare", params={"jobs": f"{a.id},{b.id}", "job": "1"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "job"], r.text
    r = app.api.get("/api/compare", params={"jobs": f"{a.id},999"})
    assert r.status_code == 404 and "999" in r.json()["detail"]

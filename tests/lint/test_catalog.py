"""What a job may name, checked at submit and offered by the form: datasets from dataset_info.json,
LLaMA-Factory's templates, the template a model folder needs, each key's help, a dataset's first rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils.servers import demo_config
from tunedeck.checks import lint, tables

SEED_YAML = (Path(__file__).parent / "data" / "seed_qwen2_lora_sft.yaml").read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    """One app for the module (launches held); an empty HF cache of its own."""
    from tests.utils.app import App

    mp = pytest.MonkeyPatch()
    hf = tmp_path_factory.mktemp("hf")
    mp.setenv("HF_HUB_CACHE", str(hf / "hub"))
    mp.setenv("HF_DATASETS_CACHE", str(hf / "datasets"))
    app = App(tmp_path_factory.mktemp("ws"), assets).start()
    yield app
    app.stop()
    mp.undo()


def by_loc(r) -> dict[tuple, dict]:
    assert r.status_code == 422, r.text
    return {tuple(d["loc"]): d for d in r.json()["detail"]}


def test_a_mistyped_dataset_name_is_refused_naming_the_close_ones(server, assets):
    spec = {"name": "typo", "config": demo_config(assets, dataset="demo_identiy"), "gpus": 0}
    d = by_loc(server.api.post("/api/jobs", json=spec))[("config", "dataset")]
    assert d["code"] == "LF014" and "'demo_identiy'" in d["msg"] and "demo_identity" in d["msg"]
    spec["config"].update(dataset="demo_identity", eval_dataset="demo_identity_smal, demo_identity")
    d = by_loc(server.api.post("/api/jobs", json=spec))[("config", "eval_dataset")]
    assert "demo_identity_small" in d["msg"]
    spec["config"].pop("eval_dataset")
    assert server.api.post("/api/jobs", json=spec).status_code == 201


def test_an_unknown_template_is_an_error_and_the_fit_comes_from_data():
    (f,) = [f for f in lint.lint({"template": "qwen2"}) if f["code"] == "LF016"]
    assert f["severity"] == "error" and f["path"] == "config.template" and "qwen" in f["message"]
    qwen = {"model_type": "qwen2"}
    (f,) = [f for f in lint.lint({"template": "qwen2"}, model_config=qwen) if f["code"] == "LF016"]
    assert f["fix"] == "set `template: qwen`"  # the model's own template, not only the closest name
    assert not [f for f in lint.lint({"template": "qwen3_nothink"}) if f["code"] == "LF016"]


def test_the_seeds_yaml_as_is_is_refused_at_submit_with_the_fix(server):
    r = server.api.post(
        "/api/jobs/yaml",
        params={"name": "seed"},
        content=SEED_YAML,
        headers={"content-type": "application/yaml"},
    )
    errs = by_loc(r)
    d = errs[("config", "model_name_or_path")]
    assert d["code"] == "LF013" and "'Qwen/Qwen2-7B-Instruct'" in d["msg"] and "offline" in d["msg"]
    assert (
        "download it into the workspace" in d["msg"]
        and "point `model_name_or_path` to that folder" in d["msg"]
    )
    assert str(server.workspace / "models" / "Qwen2-7B-Instruct") in d["msg"]


def test_key_help_comes_from_llamafactorys_table(server):
    r = server.api.get("/api/ui/help", params={"keys": "lora_rank,learning_rate,not_a_key"})
    assert r.status_code == 200, r.text
    body = r.json()
    table = tables.lf_table()["args"]
    assert set(body["keys"]) == {"lora_rank", "learning_rate"}
    assert (
        body["keys"]["lora_rank"]["help"] == table["lora_rank"]["help"] and body["keys"]["lora_rank"]["help"]
    )
    assert len(server.api.get("/api/ui/help").json()["keys"]) == len(table)
    r = server.api.get("/api/ui/help", params={"key": "lora_rank"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "key"]


def test_templates_datasets_and_a_preview_for_the_form(server, assets):
    names = server.api.get("/api/ui/templates").json()["templates"]
    assert "qwen" in names and "llama3" in names and names == sorted(names)
    data = str(assets / "demo" / "data")
    r = server.api.get("/api/ui/datasets", params={"dataset_dir": data})
    assert r.json()["datasets"] == ["demo_identity", "demo_identity_small"]
    first = json.loads((assets / "demo" / "data" / "demo_identity.json").read_text())[:2]
    r = server.api.get(
        "/api/ui/dataset-preview", params={"dataset_dir": data, "name": "demo_identity", "rows": 2}
    )
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == first and r.json()["formatting"] == "alpaca"
    r = server.api.get("/api/ui/dataset-preview", params={"dataset_dir": data, "name": "demo_identiy"})
    assert by_loc(r)[("query", "name")]["msg"].endswith("(closest: demo_identity, demo_identity_small)")
    r = server.api.get("/api/ui/model-templates", params={"model": str(assets / "demo" / "model")})
    assert r.json() == {"model_type": "qwen2", "templates": ["qwen"]}


def test_the_form_reads_nothing_outside_the_allowed_roots(server, tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"secret": {"file_name": "s.json"}}))
    (tmp_path / "s.json").write_text('[{"instruction": "secret"}]')
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    for path, params, key in [
        ("/api/ui/datasets", {"dataset_dir": str(tmp_path)}, "dataset_dir"),
        ("/api/ui/dataset-preview", {"dataset_dir": str(tmp_path), "name": "secret"}, "dataset_dir"),
        ("/api/ui/model-templates", {"model": str(tmp_path)}, "model"),
    ]:
        d = by_loc(server.api.get(path, params=params))[("query", key)]
        assert "allowed roots" in d["msg"], d
    # A dataset_info.json inside the roots whose file_name climbs out of it.
    inside = server.workspace / "sets"
    inside.mkdir()
    (inside / "dataset_info.json").write_text(json.dumps({"out": {"file_name": str(tmp_path / "s.json")}}))
    r = server.api.get("/api/ui/dataset-preview", params={"dataset_dir": str(inside), "name": "out"})
    assert "outside the allowed roots" in by_loc(r)[("query", "dataset_dir")]["msg"]


def test_paths_no_os_call_takes_are_a_422_at_the_parameter(server):
    for params, key in [
        ({"dataset_dir": "data\0x"}, "dataset_dir"),
        ({"dataset_dir": "d" * 3000}, "dataset_dir"),
    ]:
        assert ("query", key) in by_loc(server.api.get("/api/ui/datasets", params=params))
    assert ("query", "model") in by_loc(server.api.get("/api/ui/model-templates", params={"model": "m\0"}))
    assert ("query", "model") in by_loc(
        server.api.get("/api/ui/model-templates", params={"model": "m" * 3000})
    )


def test_a_dataset_with_no_dataset_info_is_refused_naming_what_exists(app_factory, assets):
    """The seed guide's `dataset: identity` on a fresh install: no dataset_info.json anywhere it looks.
    Refused at submit (it used to be a warning, and the run died ~80 s in), naming what exists."""
    app = app_factory()
    data = assets / "demo" / "data"
    config = demo_config(assets, dataset="identity")
    config.pop("dataset_dir")  # LLaMA-Factory's default: the workspace's data folder, not there
    d = by_loc(app.api.post("/api/jobs", json={"name": "seed", "config": config}))[("config", "dataset")]
    assert d["code"] == "LF015" and "'identity' cannot be found" in d["msg"], d
    assert f"demo_identity, demo_identity_small (in {data})" in d["msg"], d  # what the server has
    ws_info = app.workspace / "data" / "dataset_info.json"
    fix = d["msg"].split(" — fix: ")[1]
    assert f"add 'identity' to {ws_info}" in fix and '"file_name": "identity.json"' in fix, d
    assert "`tunedeck datasets add identity FILE`" in fix and "POST /api/datasets" in fix, d
    # A name another folder defines: the fix is that folder.
    config["dataset"] = "demo_identity"
    d = by_loc(app.api.post("/api/jobs", json={"name": "seed", "config": config}))[("config", "dataset")]
    assert d["msg"].endswith(
        f"fix: set `dataset_dir: {data}` (its dataset_info.json defines 'demo_identity')"
    ), d
    # A dataset_info.json that is not JSON fails the run as surely: refused too, saying why.
    ws_info.parent.mkdir()
    ws_info.write_text("{not json")
    d = by_loc(app.api.post("/api/jobs", json={"name": "seed", "config": config}))[("config", "dataset")]
    assert "is not valid JSON" in d["msg"], d
    # The one the fix names is taken.
    r = app.api.post("/api/jobs", json={"name": "seed", "config": {**config, "dataset_dir": str(data)}})
    assert r.status_code == 201, r.text
    assert app.api.get("/api/jobs").json()["jobs"][0]["name"] == "seed"


def test_the_datasets_the_server_has_are_listed_with_size_and_rows(app_factory, assets, tmp_path):
    app = app_factory()
    data = app.workspace / "data"
    data.mkdir(parents=True)
    (tmp_path / "secret.json").write_text('[{"instruction": "secret"}]')
    (data / "mine.jsonl").write_text(
        '{"instruction": "a", "output": "b"}\n\n{"instruction": "c", "output": "d"}\n'
    )
    (data / "dataset_info.json").write_text(
        json.dumps(
            {
                "mine": {"file_name": "mine.jsonl"},
                "chat": {"hf_hub_url": "org/chat", "formatting": "sharegpt"},
                "out": {"file_name": str(tmp_path / "secret.json")},
            }
        )
    )
    hidden = app.workspace / "runs" / "000001-x"  # a run folder's copy is no dataset of the server's
    hidden.mkdir(parents=True)
    (hidden / "dataset_info.json").write_text(json.dumps({"copy": {"file_name": "c.json"}}))
    r = app.api.get("/api/datasets")
    assert r.status_code == 200, r.text
    got = {(d["dataset_dir"], d["name"]): d for d in r.json()["datasets"]}
    demo = assets / "demo" / "data"
    assert set(got) == {(str(data), n) for n in ("mine", "chat", "out")} | {
        (str(demo), n) for n in ("demo_identity", "demo_identity_small")
    }
    identity = got[(str(demo), "demo_identity")]
    assert identity["rows"] == len(json.loads((demo / "demo_identity.json").read_text())) == 64
    assert identity["size_bytes"] == (demo / "demo_identity.json").stat().st_size
    mine = got[(str(data), "mine")]
    assert (mine["rows"], mine["formatting"], mine["problem"]) == (2, "alpaca", None)
    assert (
        got[(str(data), "chat")]["formatting"] == "sharegpt" and "hub" in got[(str(data), "chat")]["problem"]
    )
    out = got[(str(data), "out")]
    assert "outside the allowed roots" in out["problem"] and out["rows"] is None and out["file"] is None
    r = app.api.get("/api/datasets", params={"dir": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "dir"], r.text

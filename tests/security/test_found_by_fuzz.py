"""Inputs the schema fuzzer found answered with a 500, each pinned to its clear refusal."""

from __future__ import annotations

from tests.utils.servers import demo_config


def test_a_clone_with_no_devices_is_refused_at_the_field(app_factory, assets):
    app = app_factory()
    parent = app.submit({"name": "p", "config": demo_config(assets), "gpus": 0})
    r = app.api.post(f"/api/jobs/{parent['id']}/clone", json={"devices": []})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "devices"]


def test_a_home_folder_of_nobody_is_a_plain_folder_name(app_factory, assets):
    """`~nobody/x` (no such user): Path.expanduser raises; LLaMA-Factory's os.path keeps it as written."""
    app = app_factory()
    r = app.api.get("/api/ui/datasets", params={"dataset_dir": "~no-such-user-here/data"})
    assert r.status_code == 422, r.text
    assert "no-such-user-here" in r.json()["detail"][0]["msg"]
    config = demo_config(assets, model_name_or_path="~no-such-user-here/model")
    r = app.api.post("/api/jobs", json={"name": "tilde", "config": config, "gpus": 0})
    assert r.status_code == 422, r.text  # a model the run would load must be there
    assert r.json()["detail"][0]["loc"] == ["config", "model_name_or_path"]
    assert "does not exist" in r.json()["detail"][0]["msg"], r.text
    (app.workspace / "~no-such-user-here" / "model").mkdir(parents=True)
    r = app.api.post("/api/jobs", json={"name": "tilde", "config": config, "gpus": 0})
    assert r.status_code == 201, r.text
    text = app.api.get(f"/api/jobs/{r.json()['id']}/config").json()["train_yaml"]
    assert f"model_name_or_path: {app.workspace.resolve() / '~no-such-user-here' / 'model'}\n" in text


def test_a_preset_text_no_yaml_file_can_hold_is_refused_at_the_text(app_factory):
    """`POST /api/presets` with control characters (and surrogate pairs) in its text answered 500."""
    app = app_factory()
    body = b'{"name": "l", "text": "\\u00bb\\u0090N\\ud9e7\\ude79\\u001e\\u00c7\\ud92b\\udfe0"}'
    r = app.api.post("/api/presets", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "text"]]
    assert "U+0090" in r.json()["detail"][0]["msg"]
    assert app.api.get("/api/presets/l").status_code == 404

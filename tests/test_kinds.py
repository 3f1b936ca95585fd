"""Job kinds through the API, the app in process (nothing runs here): each kind renders its own command's
keys, and a spec that the command would refuse is a 422 at the key, before it takes a slot."""

from __future__ import annotations

import yaml

from tests.utils.servers import demo_config
from tunedeck.checks import kinds, tables


def model(assets) -> str:
    return str(assets / "demo" / "model")


def by_loc(r) -> dict[tuple, dict]:
    assert r.status_code == 422, r.text
    return {tuple(d["loc"]): d for d in r.json()["detail"]}


def preview(app, spec: dict) -> dict:
    r = app.api.post("/api/ui/preview", json=spec)
    assert r.status_code == 200, r.text
    return yaml.safe_load(r.json()["train_yaml"])


def test_each_kind_renders_its_commands_keys(app_factory, assets):
    app = app_factory()
    data = {
        "dataset_dir": str(assets / "demo" / "data"),
        "eval_dataset": "demo_identity_small",
        "template": "qwen",
    }
    ran = preview(
        app, {"name": "p", "kind": "predict", "config": {"model_name_or_path": model(assets), **data}}
    )
    assert ran["do_predict"] is True and ran["predict_with_generate"] is True and ran["do_train"] is False
    assert ran["output_dir"].endswith("/output") and ran["stage"] == "sft"
    ran = preview(app, {"name": "e", "kind": "eval", "config": {"model_name_or_path": model(assets), **data}})
    assert ran["do_eval"] is True and ran["do_train"] is False and not ran["predict_with_generate"]

    # export and api parse no trainer arguments: no output_dir, no do_train, no token counting.
    r = app.api.post(
        "/api/ui/preview",
        json={
            "name": "x",
            "kind": "export",
            "config": {
                "model_name_or_path": model(assets),
                "adapter_name_or_path": model(assets),
                "export_dir": "/etc",
            },
        },
    )
    assert r.status_code == 200, r.text
    assert any("export_dir '/etc' ignored" in w for w in r.json()["warnings"])
    ran = yaml.safe_load(r.json()["train_yaml"])
    assert ran["export_dir"].endswith("/output")
    trainer = {k for k, v in tables.lf_table()["args"].items() if v["group"] == "TrainingArguments"}
    assert not trainer & ran.keys(), trainer & ran.keys()
    ran = preview(app, {"name": "c", "kind": "chat", "config": {"model_name_or_path": model(assets)}})
    assert not trainer & ran.keys() and "export_dir" not in ran

    r = app.api.post(
        "/api/estimate", json={"name": "c", "kind": "chat", "config": {"model_name_or_path": model(assets)}}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["kind"], r.text
    # A train job is what it always was.
    ran = preview(app, {"name": "t", "config": demo_config(assets)})
    assert ran["do_train"] is True and ran["include_num_input_tokens_seen"] is True


def test_specs_the_command_would_refuse_are_422_at_the_key(app_factory, assets):
    app = app_factory()
    m = {"model_name_or_path": model(assets)}
    d = by_loc(
        app.api.post("/api/jobs", json={"name": "p", "kind": "predict", "config": {**m, "dataset": "x"}})
    )
    assert "required for a predict job" in d[("config", "eval_dataset")]["msg"]
    d = by_loc(app.api.post("/api/jobs", json={"name": "x", "kind": "export", "config": m}))
    assert "the LoRA adapter to merge" in d[("config", "adapter_name_or_path")]["msg"]
    d = by_loc(
        app.api.post(
            "/api/jobs",
            json={"name": "q", "kind": "export", "config": {**m, "export_quantization_bit": 4}, "gpus": 0},
        )
    )
    assert "needs a GPU" in d[("config", "export_quantization_bit")]["msg"]
    assert ("config", "export_quantization_dataset") in d
    d = by_loc(
        app.api.post(
            "/api/jobs", json={"name": "c", "kind": "chat", "config": {**m, "learning_rate": 1e-4}, "gpus": 0}
        )
    )
    assert "llamafactory-cli api" in d[("config", "learning_rate")]["msg"]
    d = by_loc(
        app.api.post(
            "/api/jobs",
            json={"name": "p", "kind": "predict", "config": {**m, "eval_dataset": "x", "stage": "dpo"}},
        )
    )
    assert ("config", "stage") in d
    d = by_loc(app.api.post("/api/jobs", json={"name": "k", "kind": "serve", "config": m}))
    assert ("body", "kind") in d
    # A YAML names its kind in the query, as LLaMA-Factory's own export YAMLs are run by another command.
    r = app.api.post(
        "/api/jobs/yaml",
        params={"name": "y", "kind": "export"},
        content=yaml.safe_dump({**m, "learning_rate": 1e-4}),
        headers={"Content-Type": "application/yaml"},
    )
    assert {("config", "adapter_name_or_path"), ("config", "learning_rate")} <= by_loc(r).keys()
    # Paths stay confined whatever the kind.
    d = by_loc(
        app.api.post(
            "/api/jobs",
            json={"name": "c", "kind": "chat", "config": {**m, "adapter_name_or_path": "/etc"}, "gpus": 0},
        )
    )
    assert ("config", "adapter_name_or_path") in d


def test_a_predict_job_is_refused_where_its_metric_packages_are_missing():
    config = {"model_name_or_path": "m", "eval_dataset": "d"}
    args = tables.lf_table()["args"]
    preflight = {"packages": {"jieba": None, "nltk": "3.10.4", "rouge_chinese": "1.0.3"}}
    errors, _ = kinds.check(kinds.KINDS["predict"], config, args=args, gpus=0, preflight=preflight)
    assert [e["loc"] for e in errors] == [["kind"]] and "`jieba`" in errors[0]["msg"]
    assert kinds.check(kinds.KINDS["eval"], config, args=args, gpus=0, preflight=preflight)[0] == []
    preflight["packages"]["jieba"] = "0.42.1"
    assert kinds.check(kinds.KINDS["predict"], config, args=args, gpus=0, preflight=preflight)[0] == []


def test_results_and_chat_routes_answer_clearly_before_anything_ran(app_factory, assets):
    app = app_factory()
    job = app.submit({"name": "t", "config": demo_config(assets), "gpus": 0})
    res = app.api.get(f"/api/jobs/{job['id']}/results").json()
    assert res == {"job_id": job["id"], "kind": "train", "metrics": [], "predictions": 0, "export": None}
    page = app.api.get(f"/api/jobs/{job['id']}/predictions", params={"offset": 5}).json()
    assert page == {"rows": [], "offset": 5, "total": 0}
    r = app.api.get(f"/api/jobs/{job['id']}/predictions", params={"limit": 100000})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "limit"]
    assert app.api.get("/api/jobs/999/results").status_code == 404
    r = app.api.post(f"/api/jobs/{job['id']}/chat", json={})
    assert r.status_code == 409 and "finished train or export job" in r.json()["detail"]
    r = app.api.post(f"/api/jobs/{job['id']}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 409 and "not a chat job" in r.json()["detail"]
    r = app.api.post(f"/api/jobs/{job['id']}/v1/chat/completions", content=b"{not json")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "messages"]
    assert app.api.post("/api/jobs/999/chat", json={}).status_code == 404

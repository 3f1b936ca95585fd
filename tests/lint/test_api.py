"""Lint, estimate and preflight through the API (the app in process, launches held: nothing trains here)."""

from __future__ import annotations

import copy
import json
import socket

from tests.preflight.test_preflight import assert_summary_fits_this_machine
from tests.utils.servers import CONFIGS, demo_config

SEED_DS = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())


def typo(value) -> dict:
    ds = copy.deepcopy(SEED_DS)
    ds["fp16"]["enabled"] = False
    ds["zero_optimization"]["stage3_parition_grads"] = value
    return ds


def test_submission_refuses_lint_errors_at_the_field(app_factory, assets):
    server = app_factory(TUNEDECK_LAUNCH_PAUSED="true")
    spec = {
        "name": "seed-typo",
        "config": demo_config(assets, lora_rnak=8),
        "deepspeed": typo(True),
        "gpus": 0,
    }
    r = server.api.post("/api/jobs", json=spec)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    by_loc = {tuple(d["loc"]): d for d in detail}
    d = by_loc[("deepspeed", "zero_optimization", "stage3_parition_grads")]
    assert d["type"] == "lint_error" and d["code"] == "DS001"
    assert d["msg"].startswith("DS001: ") and "fix:" in d["msg"]
    assert by_loc[("config", "lora_rnak")]["code"] == "LF001"
    assert (
        len([d for d in detail if d["loc"] == ["config", "lora_rnak"]]) == 1
    )  # not also the spec's own error
    assert server.api.get("/api/jobs").json()["jobs"] == []


def test_submission_returns_warnings_and_stores_the_estimate(app_factory, assets):
    server = app_factory(TUNEDECK_LAUNCH_PAUSED="true")
    created = server.submit(
        {"name": "auto-typo", "config": demo_config(assets), "deepspeed": typo("auto"), "gpus": 0}
    )
    codes = {f["code"]: f for f in created["findings"]}
    assert codes["DS002"]["path"] == "deepspeed.zero_optimization.stage3_parition_grads"
    assert codes["DS002"]["severity"] == "warning"
    assert all(f["severity"] != "error" for f in created["findings"])
    assert isinstance(created["warnings"], list)
    est = server.api.get(f"/api/jobs/{created['id']}/estimate").json()
    assert est["estimate"]["zero_stage"] == 3 and est["estimate"]["gpus"] == 0
    assert est["estimate"]["per_gpu_bytes"] == sum(est["estimate"]["breakdown"].values())
    assert est["measured"] is None  # not run yet
    # The CPU demo preset: no findings above info.
    created = server.submit({"name": "demo", "config": demo_config(assets), "gpus": 0})
    assert [f for f in created["findings"] if f["severity"] != "info"] == []


def test_lint_and_estimate_endpoints(app_factory, assets):
    server = app_factory(TUNEDECK_LAUNCH_PAUSED="true")
    spec = {
        "name": "x",
        "config": demo_config(assets, fp16=True, bf16=True),
        "deepspeed": typo(True),
        "gpus": 0,
    }
    findings = server.api.post("/api/lint", json=spec).json()["findings"]
    assert {"DS001", "LF005"} <= {f["code"] for f in findings}
    assert set(findings[0]) == {"code", "severity", "path", "message", "fix"}
    good = {"name": "x", "config": demo_config(assets), "deepspeed": "ds_z3_rocm", "gpus": 0}
    r = server.api.post("/api/estimate", json={**good, "device_total_bytes": 1024})
    assert r.status_code == 200, r.text
    est = r.json()
    assert set(est) >= {"per_gpu_bytes", "breakdown", "device_total_bytes", "fits", "warnings"}
    assert est["fits"] is False and est["device_total_bytes"] == 1024 and est["warnings"]
    assert server.api.post("/api/estimate", json=good).json()["fits"] is None
    r = server.api.post(
        "/api/estimate", json={**good, "config": {**good["config"], "model_name_or_path": "nope/none"}}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["config", "model_name_or_path"]
    assert server.api.post("/api/jobs", json=spec).status_code == 422
    assert server.api.get("/api/presets").status_code == 200
    names = {p["name"] for p in server.api.get("/api/presets").json()}
    assert {"qwen2_lora_sft", "ds_z3_rocm", "ds_z2_rocm", "ds_z3_offload_rocm", "demo_cpu"} <= names


def test_preflight_endpoint(app_factory):
    server = app_factory()
    r = server.api.get("/api/nodes/local/preflight")
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["ok"] is True
    assert_summary_fits_this_machine(result["summary"])
    assert (
        server.api.get(f"/api/nodes/{socket.gethostname()}/preflight").json()["checked_at"]
        == result["checked_at"]
    )
    assert server.api.get("/api/nodes/elsewhere/preflight").status_code == 404


def test_every_json_route_declares_its_answer(app_factory):
    """A model (or a list of one) per JSON answer: an open object would let any shape through the fuzz
    test's schema check and leave clients guessing."""
    spec = app_factory().api.get("/openapi.json").json()
    untyped = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            for status, response in op["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                if status.startswith("2") and schema is not None:
                    if "$ref" not in schema.get("items", schema):
                        untyped.append(f"{method.upper()} {path}")
    assert not untyped, untyped

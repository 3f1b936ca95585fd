"""One submission pipeline: each file of a spec is read once per request, lint, preview and submit
refuse the same things, and the node's GPU sizes come from the inventory, not an SMI open per submit."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.preflight.test_node_lint import stand_in_python
from tests.utils.servers import CONFIGS, ROOT, demo_config

GiB = 2**30
SEED_DS = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())

# Every `open` of the files a test watches (an audit hook cannot be removed: one for the process).
_watched: set[str] = set()
_opened: list[str] = []
_hooked = False


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _watched and isinstance(args[0], str | Path) and str(args[0]) in _watched:
        _opened.append(str(args[0]))


def watch(paths: list[Path]) -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    _watched.clear()
    _watched.update(str(p) for p in paths)
    _opened.clear()


@pytest.fixture
def opens():
    yield watch
    _watched.clear()
    _opened.clear()


def ds_auto() -> dict:
    ds = copy.deepcopy(SEED_DS)
    ds["fp16"]["enabled"] = "auto"  # agrees with any training arguments
    return ds


def test_each_file_of_a_spec_is_read_once_per_request(app_factory, assets, opens):
    app = app_factory()
    model = (app.workspace / "models" / "m").resolve()
    model.mkdir(parents=True)
    for f in (assets / "demo" / "model").glob("*.json"):
        shutil.copy(f, model / f.name)
    ds_file = (app.workspace / "my_ds.json").resolve()
    ds_file.write_text(json.dumps(ds_auto()))
    # trust_remote_code makes the reach rules look into the model's *config.json files as well.
    config = demo_config(assets, model_name_or_path="models/m", trust_remote_code=True)
    spec = {"name": "once", "config": config, "deepspeed": "my_ds.json", "gpus": 0}
    model_files = sorted(model.glob("*config.json"))
    assert model / "config.json" in model_files
    calls = [
        ("/api/jobs", {"json": spec}),
        ("/api/lint", {"json": spec}),
        ("/api/estimate", {"json": spec}),
        ("/api/ui/preview", {"json": spec}),
        (
            "/api/jobs/yaml",
            {
                "params": {"name": "once-yaml"},
                "headers": {"Content-Type": "application/yaml"},
                "content": yaml.safe_dump({**config, "deepspeed": "my_ds.json"}),
            },
        ),
    ]
    for path, kw in calls:
        opens([ds_file, *model_files])
        r = app.api.post(path, **kw)
        assert r.status_code in (200, 201), (path, r.text)
        assert _opened.count(str(ds_file)) == 1, (path, _opened)
        assert _opened.count(str(model / "config.json")) == 1, (path, _opened)
        assert all(_opened.count(str(f)) <= 1 for f in model_files), (path, _opened)
        if path == "/api/lint":
            assert "LF009" in {f["code"] for f in r.json()["findings"]}  # the model's files were looked at


def test_the_estimate_of_a_multi_node_spec_counts_its_nodes(app_factory, assets):
    """The API estimates a spec of 2 nodes × 4 GPUs as the 8 ranks ZeRO-3 shards over, whatever the executor."""
    app = app_factory()
    config = demo_config(assets, finetuning_type="full")

    def per_gpu(gpus: int, nodes: int) -> dict:
        spec = {"name": "n", "config": config, "deepspeed": ds_auto(), "gpus": gpus, "nodes": nodes}
        r = app.api.post("/api/estimate", json={**spec, "device_total_bytes": 64 * GiB})
        assert r.status_code == 200, r.text
        return r.json()

    across, eight, four = per_gpu(4, 2), per_gpu(8, 1), per_gpu(4, 1)
    assert across["per_gpu_bytes"] == eight["per_gpu_bytes"] < four["per_gpu_bytes"]
    assert (across["nodes"], across["ranks"]) == (2, 8)


def test_lint_preview_and_submit_refuse_the_same_things(app_factory, assets):
    app = app_factory()
    ds = ds_auto()
    ds["zero_optimization"]["stage3_parition_grads"] = True  # the seed's typo: DeepSpeed refuses it
    spec = {
        "name": "typo",
        "config": demo_config(assets, lora_rnak=8, fp16=True, bf16=True),
        "deepspeed": ds,
        "gpus": 0,
    }
    submitted = app.api.post("/api/jobs", json=spec)
    assert submitted.status_code == 422, submitted.text
    detail = submitted.json()["detail"]
    assert {
        ("deepspeed", "zero_optimization", "stage3_parition_grads"),
        ("config", "lora_rnak"),
        ("config", "bf16"),
    } <= {tuple(d["loc"]) for d in detail}
    previewed = app.api.post("/api/ui/preview", json=spec)
    assert previewed.status_code == 422, previewed.text
    assert previewed.json()["detail"] == detail
    errors = [f for f in app.api.post("/api/lint", json=spec).json()["findings"] if f["severity"] == "error"]
    assert {(f["path"], f["code"]) for f in errors} == {(".".join(d["loc"]), d["code"]) for d in detail}
    assert app.api.get("/api/jobs").json()["jobs"] == []


def test_an_estimate_of_values_it_cannot_use_is_a_422_at_the_key(app_factory, assets):
    app = app_factory()
    for value in ("nan", "inf"):
        spec = {"name": "odd", "config": demo_config(assets, cutoff_len=value), "gpus": 0}
        r = app.api.post("/api/estimate", json=spec)
        assert r.status_code == 422, r.text
        (d,) = r.json()["detail"]
        assert d["loc"] == ["config", "cutoff_len"] and d["code"] == "LF003"
        assert app.api.post("/api/jobs", json=spec).json()["detail"] == [d]


def fake_nvml(monkeypatch, tmp_path, devices: list[dict]) -> list[int]:
    """The NVML stand-in (tests/fakes) as `pynvml` in this process; returns a list that grows by one
    at each nvmlInit, i.e. each time the server opens the SMI library."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": devices}))
    monkeypatch.setenv("TUNEDECK_FAKE_SMI_TRACE", str(trace))
    fakes = ROOT / "tests" / "fakes"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the stand-in puts its folder first; undone after
    for name, path in (("smi_trace", fakes / "smi_trace.py"), ("pynvml", fakes / "nvml" / "pynvml.py")):
        found = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(found)
        monkeypatch.setitem(sys.modules, name, module)
        found.loader.exec_module(module)
    # That folder also holds the amdsmi stand-in, which pyrsmi would take up: this is an NVIDIA node.
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != fakes.resolve()]
    inits: list[int] = []
    real = module.nvmlInit

    def counting() -> None:
        inits.append(1)
        real()

    monkeypatch.setattr(module, "nvmlInit", counting)
    return inits


def test_submissions_take_the_gpu_sizes_from_the_node_inventory(app_factory, assets, tmp_path, monkeypatch):
    inits = fake_nvml(
        monkeypatch,
        tmp_path,
        [
            {"name": "NVIDIA H100", "bdf": "0000:01:00.0", "total": 80 * GiB, "vram": [GiB]},
            {"name": "NVIDIA A100", "bdf": "0000:02:00.0", "total": 40 * GiB, "vram": [GiB]},
        ],
    )
    app = app_factory(TUNEDECK_TRAIN_PYTHON=str(stand_in_python(tmp_path)), TUNEDECK_NODES_CACHE_S="0")
    assert app.api.get("/api/health").json()["gpus"] == 2
    spec = {"name": "sized", "config": demo_config(assets), "gpus": 0}
    est = app.api.post("/api/estimate", json=spec).json()
    assert est["device_total_bytes"] == 40 * GiB  # the smallest GPU the inventory read
    after_first = len(inits)
    for i in range(3):
        app.submit({**spec, "name": f"sized-{i}"})
        assert app.api.post("/api/estimate", json=spec).json()["device_total_bytes"] == 40 * GiB
    for path in ("/api/lint", "/api/ui/preview"):
        assert app.api.post(path, json=spec).status_code == 200
    assert len(inits) == after_first, "a submission opened the SMI library"
    stored = app.api.get("/api/jobs").json()["jobs"][0]["id"]
    assert app.api.get(f"/api/jobs/{stored}/estimate").json()["estimate"]["device_total_bytes"] == 40 * GiB
    # The inventory itself still reads live values for the nodes page.
    (node,) = app.api.get("/api/nodes").json()
    assert node["backend"] == "nvidia" and [g["total_bytes"] for g in node["gpus"]] == [80 * GiB, 40 * GiB]
    assert len(inits) > after_first

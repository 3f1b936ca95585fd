"""Hardware-aware lint at submission, from the node's preflight.

The training environment is a stand-in at the hardware boundary on any host: a "python" that answers
the probe as a ROCm node with two MI300X (gfx942) would, so the verdicts do not depend on this machine.
On a GPU host the real probe runs too (test_preflight's test_this_machine_passes_as_what_it_is).
Launches are held.
"""

from __future__ import annotations

import json

from tests.preflight.test_preflight import ROCM_BOX
from tests.utils.servers import demo_config
from tests.utils.wait import until
from tunedeck.checks.preflight import MARK


def stand_in_python(tmp_path):
    path = tmp_path / "rocm-python"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{MARK}{json.dumps(ROCM_BOX)}\nEOF\n")
    path.chmod(0o755)
    return path


def test_submission_lint_uses_the_nodes_preflight(app_factory, assets, tmp_path):
    server = app_factory(
        TUNEDECK_LAUNCH_PAUSED="true",
        TUNEDECK_GPU_SLOTS="2",
        TUNEDECK_TRAIN_PYTHON=str(stand_in_python(tmp_path)),
    )
    result = server.api.get("/api/nodes/local/preflight").json()
    assert result["ok"] and result["summary"] == "ROCm 6.2.41133: 2× gfx942"
    created = server.submit({"name": "fp16-on-mi300", "config": demo_config(assets, fp16=True), "gpus": 2})
    codes = {f["code"]: f for f in created["findings"]}
    assert codes["HW001"]["path"] == "config.fp16" and "bf16" in codes["HW001"]["fix"]
    assert codes["HW002"]["path"] == "config.ddp_timeout"
    ok = server.submit(
        {"name": "bf16", "config": demo_config(assets, bf16=True, ddp_timeout=180000000), "gpus": 2}
    )
    assert not [f for f in ok["findings"] if f["code"].startswith("HW")]
    r = server.api.post("/api/jobs", json={"name": "too-many", "config": demo_config(assets), "gpus": 3})
    assert r.status_code == 422
    (gpus,) = [d for d in r.json()["detail"] if d["loc"] == ["gpus"]]
    assert gpus["code"] == "HW003"


def test_a_gpu_node_warms_its_preflight_at_start(app_factory, assets, tmp_path):
    server = app_factory(
        TUNEDECK_LAUNCH_PAUSED="true",
        TUNEDECK_GPU_SLOTS="2",
        TUNEDECK_TRAIN_PYTHON=str(stand_in_python(tmp_path)),
    )

    def lint() -> list[dict]:
        return server.api.post(
            "/api/lint", json={"name": "x", "config": demo_config(assets, fp16=True), "gpus": 2}
        ).json()["findings"]

    # The warm-up runs in the background; no submission waits for it.
    until(lambda: any(f["code"] == "HW001" for f in lint()), "HW001 from the warmed-up preflight")

"""Predicted against measured on a real CPU fine-tune: stored with the job, recorded per device kind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.utils.servers import demo_config

pytestmark = pytest.mark.slow

MiB = 2**20


# What a CPU fine-tune holds before its first tensor: the trainer's imports. Measured here, in the
# environment the run uses, rather than read from the estimate's settings it is compared with.
RUNTIME_PROBE = (
    "import resource, torch, transformers\n"
    "from llamafactory.train import tuner\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"  # Linux reports KiB
)


def measured_runtime() -> int:
    out = subprocess.run([sys.executable, "-c", RUNTIME_PROBE], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def test_cpu_demo_predicted_against_measured(server_factory, assets):
    runtime = measured_runtime()
    server = server_factory(TUNEDECK_ESTIMATE_CPU_RUNTIME_BYTES=str(runtime))
    created = server.submit({"name": "demo-estimate", "config": demo_config(assets), "gpus": 0})
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"))
    assert job["status"] == "succeeded", job
    out = server.api.get(f"/api/jobs/{job['id']}/estimate").json()
    predicted, measured = out["estimate"]["per_gpu_bytes"], out["measured"]
    assert measured is not None and measured["source"] == "memory_samples" and measured["gpu_kind"] == "cpu"
    assert out["estimate"]["breakdown"]["runtime"] == runtime
    assert out["ratio"] == measured["bytes"] / predicted
    print(
        f"\nCPU demo: runtime term measured {runtime / MiB:.0f} MiB; predicted {predicted / MiB:.0f} MiB, "
        f"measured peak RSS {measured['bytes'] / MiB:.0f} MiB, "
        f"measured/predicted {out['ratio']:.2f}; breakdown (MiB): "
        + ", ".join(f"{k} {v / MiB:.2f}" for k, v in out["estimate"]["breakdown"].items())
    )
    # The tensors of a 100k-parameter model are noise next to the interpreter with torch: the runtime
    # term carries the estimate, and it must land within a factor of two of the process tree's RSS.
    assert 0.5 < out["ratio"] < 2.0
    calibration = server.api.get("/api/estimates/calibration").json()
    assert [(c["gpu_kind"], c["jobs"]) for c in calibration] == [("cpu", 1)]
    assert abs(calibration[0]["mean_ratio"] - out["ratio"]) < 1e-9
    server.api.get(f"/api/jobs/{job['id']}/estimate")  # read again: still one row
    assert server.api.get("/api/estimates/calibration").json()[0]["jobs"] == 1

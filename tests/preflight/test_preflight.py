"""Preflight: the real probe on this CPU machine, and the verdicts on probe results from other machines."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

from tests.utils.hardware import torch_gpus
from tunedeck.checks import preflight

ROCM_BOX = {
    "hostname": "mi300-01",
    "python": "/opt/venv/bin/python",
    "machine": {
        "rocm_path": "/opt/rocm",
        "kfd": True,
        "dri": True,
        "nvidia_dev": False,
        "amd_smi_tool": "/opt/rocm/bin/amd-smi",
        "nvidia_smi_tool": None,
    },
    "env": {
        "ROCM_PATH": "/opt/rocm",
        "PYTORCH_ROCM_ARCH": "gfx942",
        "HIP_VISIBLE_DEVICES": None,
        "ROCR_VISIBLE_DEVICES": None,
        "CUDA_VISIBLE_DEVICES": None,
    },
    "versions": {
        "torch": "2.5.1+rocm6.2",
        "transformers": "5.6.0",
        "llamafactory": "0.9.5",
        "deepspeed": "0.19.8",
        "jieba": "0.42.1",
        "nltk": "3.10.4",
        "rouge_chinese": "1.0.3",
    },
    "torch": {
        "version": "2.5.1+rocm6.2",
        "hip": "6.2.41133",
        "cuda": None,
        "is_available": True,
        "arch_list": ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942"],
        "devices": [
            {
                "index": i,
                "name": "AMD Instinct MI300X",
                "arch": "gfx942:sramecc+:xnack-",
                "total_bytes": 192 * 2**30,
            }
            for i in range(2)
        ],
    },
    "deepspeed": {"version": "0.19.8", "installed_ops": ["cpu_adam"]},
    "flash_attn": {"installed": True, "importable": True, "version": "2.6.3"},
    "smi": {
        "amdsmi": {"ok": True, "devices": 2},
        "pyrsmi": {"ok": True, "devices": 2},
        "pynvml": {"ok": False},
    },
}


def test_a_missing_predict_metric_package_is_named_with_the_job_kind_that_needs_it():
    raw = copy.deepcopy(ROCM_BOX)
    del raw["versions"]["jieba"]  # the probe reports what it cannot find as missing (None) or not at all
    raw["versions"]["rouge_chinese"] = None
    result = preflight.evaluate(raw)
    checks = {c["name"]: c for c in result["checks"]}
    for package in ("jieba", "rouge-chinese"):
        assert checks[package]["status"] == "warn"
        assert "predict jobs fail" in checks[package]["detail"] and package in checks[package]["fix"]
    assert checks["nltk"]["status"] == "ok"
    assert result["packages"]["jieba"] is None and result["packages"]["nltk"] == "3.10.4"


def status(result: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in result["checks"]}


def assert_summary_fits_this_machine(summary: str) -> None:
    gpus = torch_gpus()[0]
    if gpus == 0:
        assert summary.startswith("CPU only"), summary
    else:  # e.g. "CUDA 12.4: 1× sm_90"
        assert not summary.startswith("CPU only") and f"{gpus}×" in summary, summary


def test_this_machine_passes_as_what_it_is():
    """The real probe of this machine: CPU only here, the GPUs torch sees on a ROCm or CUDA host."""
    result = preflight.run(Path(sys.executable), ttl=600, refresh=True)
    assert result["ok"] is True, result["checks"]
    assert_summary_fits_this_machine(result["summary"])
    assert result["backend"] == (torch_gpus()[1] if torch_gpus()[0] else "cpu")
    s = status(result)
    assert s["torch"] == "ok" and s["gpu"] == "ok" and s["llamafactory"] == "ok"
    assert s["deepspeed"] == "ok"  # installed in the dev environment
    assert all(c["status"] != "fail" for c in result["checks"])
    assert preflight.run(Path(sys.executable), ttl=600)["checked_at"] == result["checked_at"]  # cached
    assert preflight.cached(Path(sys.executable), ttl=600) is not None


def test_a_healthy_rocm_node():
    result = preflight.evaluate(ROCM_BOX)
    assert result["ok"] and result["backend"] == "rocm"
    assert result["summary"] == "ROCm 6.2.41133: 2× gfx942"
    assert [d["arch"] for d in result["devices"]] == ["gfx942", "gfx942"]
    assert set(status(result).values()) == {"ok"}


def test_cuda_wheel_on_an_amd_box_is_red_with_the_fix():
    raw = copy.deepcopy(ROCM_BOX)
    raw["torch"] = {
        "version": "2.5.1+cu124",
        "hip": None,
        "cuda": "12.4",
        "is_available": False,
        "devices": [],
    }
    result = preflight.evaluate(raw)
    assert not result["ok"]
    torch = next(c for c in result["checks"] if c["name"] == "torch")
    assert torch["status"] == "fail" and "rocm" in torch["fix"]
    assert status(result)["gpu"] == "fail"


def test_arch_environment_and_libraries():
    raw = copy.deepcopy(ROCM_BOX)
    raw["env"].update(PYTORCH_ROCM_ARCH="gfx90a", HIP_VISIBLE_DEVICES="0,1", CUDA_VISIBLE_DEVICES="1")
    raw["flash_attn"] = {
        "installed": True,
        "importable": False,
        "error": "ImportError: undefined symbol: _ZN3c10",
    }
    raw["smi"] = {"amdsmi": {"ok": False}, "pyrsmi": {"ok": False}, "pynvml": {"ok": False}}
    raw["versions"]["llamafactory"] = "0.9.4"
    s = status(preflight.evaluate(raw))
    assert s["PYTORCH_ROCM_ARCH"] == "warn"
    assert s["visible devices"] == "fail"
    assert s["flash-attn"] == "warn" and s["smi"] == "warn" and s["llamafactory"] == "warn"

    raw = copy.deepcopy(ROCM_BOX)
    raw["torch"]["arch_list"] = ["gfx90a"]  # a wheel without the card's target
    raw["env"]["ROCR_VISIBLE_DEVICES"] = "0"
    result = preflight.evaluate(raw)
    assert status(result)["arch"] == "fail" and "invalid device function" in next(
        c["detail"] for c in result["checks"] if c["name"] == "arch"
    )
    assert status(result)["visible devices"] == "warn"


def test_a_python_that_cannot_run_the_probe(tmp_path):
    result = preflight.run(tmp_path / "no-python", ttl=0)
    assert result["ok"] is False and result["checks"][0]["status"] == "fail"
    assert "TUNEDECK_TRAIN_PYTHON" in result["checks"][0]["fix"]


def test_doctor_cli():
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", "doctor"], check=False, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert_summary_fits_this_machine(r.stdout.splitlines()[0])
    assert r.stdout.rstrip().endswith("PASS")

"""scripts/gpu_check.sh, the one prepared check for a lent GPU machine, keeps working where CI can run
it: its CPU mode drives the same server, submission, memory report, node readings and sampler cost
(a GPU session's few minutes must not be spent finding that the script rotted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.hardware import gpu_hardware

ROOT = Path(__file__).resolve().parents[1]


def check(*args: str, workspace: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    env.pop("TUNEDECK_WORKSPACE", None)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args, "--workspace", str(workspace)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_the_cpu_mode_runs_the_demo_reports_and_reads_the_node(tmp_path):
    out = check("--cpu", "--steps", "6", "--rates", "1", "--sampler-seconds", "2", workspace=tmp_path / "ws")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "== TUNEDECK_MEMORY_SAMPLE_S=1: job 1 succeeded" in text
    assert "host memory:" in text and "peak sampled" in text
    assert "estimate: predicted" in text and "measured / predicted" in text
    assert "readings (/api/nodes beside nvidia-smi" in text and "backend cpu" in text
    assert "DISAGREES" not in text
    assert "== sampler cost" in text and "gpu_check done" in text
    assert (tmp_path / "ws" / "server-1s.log").exists()


@pytest.mark.skipif(gpu_hardware(), reason="this host has a GPU: the script would run on it")
def test_without_a_gpu_it_says_so_and_points_at_the_cpu_mode(tmp_path):
    out = check(workspace=tmp_path / "ws")
    assert out.returncode == 2
    assert "no GPU here" in out.stderr and "--cpu" in out.stderr
    assert not (tmp_path / "ws").exists()  # it stopped before installing or building anything

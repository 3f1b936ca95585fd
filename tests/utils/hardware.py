"""What accelerators this machine has, asked once, so tests that differ on a GPU host branch on it.

Asked of torch in the training environment (the interpreter the server launches, as the preflight
probe does), with the SMI tools and device nodes as a second opinion: a GPU host whose torch is the
CPU build still has GPUs for the telemetry backends.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

TORCH_PROBE = (
    "import torch\n"
    "print(torch.cuda.device_count() if torch.cuda.is_available() else 0, "
    "'rocm' if torch.version.hip else 'cuda' if torch.version.cuda else 'cpu')"
)


@functools.cache
def torch_gpus() -> tuple[int, str]:
    """(devices torch sees, its build: "rocm", "cuda" or "cpu") in the training environment."""
    python = os.environ.get("TUNEDECK_TRAIN_PYTHON") or sys.executable
    out = subprocess.run([python, "-c", TORCH_PROBE], check=True, capture_output=True, text=True, timeout=600)
    count, build = out.stdout.split()[-2:]
    return int(count), build


@functools.cache
def gpu_hardware() -> bool:
    """An SMI tool on the PATH or a GPU device node: the host has GPUs, whatever torch was built for."""
    tools = ("nvidia-smi", "rocm-smi", "amd-smi")
    nodes = ("/dev/kfd", "/dev/nvidiactl")
    return any(shutil.which(t) for t in tools) or any(os.path.exists(n) for n in nodes)


def cpu_only() -> bool:
    return torch_gpus()[0] == 0 and not gpu_hardware()

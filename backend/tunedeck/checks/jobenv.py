"""Per-job environment variables: the tuning and debugging knobs a spec may set, and why others are refused.

A job may set the communication library's and the GPU runtime's own variables (so advice such as
"rerun with NCCL_DEBUG=INFO" can be followed), the allocator settings and its thread count. Device
visibility is tunedeck's (it follows the scheduler's choice), and names that make a process load a
library or read or write a file of its choosing are refused: they would run code or touch files
outside the job's run folder, which the spec checks keep confined.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from tunedeck.contract.stacks import FLIGHT_RECORDER_PREFIX

PATTERNS = (
    "NCCL_*",
    "RCCL_*",
    "HSA_*",
    "ROCR_*",
    "HIP_*",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "OMP_NUM_THREADS",
    # What PyTorch asks for on a hang: its NCCL/RCCL process group's knobs (the flight recorder's
    # TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, ...), c10d's debug level and C++ logs;
    # libfabric's (Slingshot's CXI provider) FI_*.
    "TORCH_NCCL_*",
    "TORCH_FR_BUFFER_SIZE",  # the flight recorder's newer name, for every backend (gloo too)
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "FI_*",
    # tunedeck's own check of the ranks' collective before training (tunedeck_train/lf_train.py)
    "TUNEDECK_COLLECTIVE_CHECK",
    "TUNEDECK_COLLECTIVE_TIMEOUT_S",
    "TUNEDECK_COLLECTIVE_MB",
)
VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
LOADS_OR_WRITES = re.compile(r"_(PLUGIN|LIB|LIBS|PATH|FILE|DIR)$")
NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
MAX_VARIABLES = 32
MAX_VALUE = 1024
FLIGHT_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
ALLOCATOR = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
ALLOWED_TEXT = (
    f"allowed: {', '.join(PATTERNS)}; not the visibility variables (tunedeck sets them from `devices`) "
    "nor names ending in _PLUGIN, _LIB, _LIBS, _PATH, _FILE or _DIR"
)


def _name_problem(name: str) -> str | None:
    if name in VISIBILITY:
        return (
            f"{name} is set by tunedeck from the GPUs the job is given: ask for GPUs with `devices` instead"
        )
    if not NAME.match(name) or not any(fnmatch.fnmatchcase(name, p) for p in PATTERNS):
        return f"{name!r} is not a variable a job may set; {ALLOWED_TEXT}"
    if LOADS_OR_WRITES.search(name):
        return f"{name} makes the process load or write a file of its choosing; {ALLOWED_TEXT}"
    return None


def _value_problem(name: str, value: str) -> str | None:
    if len(value) > MAX_VALUE:
        return f"is {len(value)} characters long; at most {MAX_VALUE}"
    if any(c in value for c in "\0\n\r"):
        return "must be one line of text (no NUL, newline or carriage return)"
    if name == "OMP_NUM_THREADS" and not (value.isdigit() and 1 <= int(value) <= 4096):
        return "must be a whole number of threads from 1 to 4096"
    if name in FLIGHT_BUFFER and not (value.isdigit() and int(value) <= 10**7):
        return "must be a whole number of entries (0 turns the flight recorder off), at most 10000000"
    if name == "TORCH_DISTRIBUTED_DEBUG" and value not in ("OFF", "INFO", "DETAIL"):
        return "must be OFF, INFO or DETAIL"
    if name == "TUNEDECK_COLLECTIVE_CHECK" and value not in ("0", "1"):
        return "must be 1 (check the ranks' all-reduce before training) or 0"
    if name in ("TUNEDECK_COLLECTIVE_TIMEOUT_S", "TUNEDECK_COLLECTIVE_MB") and not (
        value.isdigit() and 1 <= int(value) <= 3600
    ):
        return "must be a whole number from 1 to 3600"
    return None


def problems(env: dict[str, Any]) -> list[tuple[list[Any], str]]:
    """(location, reason) for every variable the job may not set as given."""
    if len(env) > MAX_VARIABLES:
        return [(["env"], f"sets {len(env)} variables; at most {MAX_VARIABLES}")]
    out = []
    for name, value in env.items():
        why = _name_problem(name) or _value_problem(name, value)
        if why:
            out.append((["env", name], why))
    return out


def launch(env: dict[str, str]) -> dict[str, str]:
    """The job's variables as the trainer gets them. LLaMA-Factory's torchrun launch overwrites
    PYTORCH_CUDA_ALLOC_CONF (which on ROCm also masks PYTORCH_HIP_ALLOC_CONF) unless OPTIM_TORCH=0;
    the other thing that switch does is kept. With the flight recorder on (TORCH_FR_BUFFER_SIZE or
    TORCH_NCCL_TRACE_BUFFER_SIZE), a collective that times out dumps it where the prefix says (torch's
    default is /tmp): into the run folder, the trainer's working directory, where the job's files are
    listed and where the runner reads it."""
    out = dict(env)
    if any(out.get(k, "0") not in ("", "0") for k in FLIGHT_BUFFER):
        out.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        out["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = FLIGHT_RECORDER_PREFIX
        out["TORCH_FR_DUMP_TEMP_FILE"] = FLIGHT_RECORDER_PREFIX
    if any(k in out for k in ALLOCATOR):
        out["OPTIM_TORCH"] = "0"
        out["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    return out

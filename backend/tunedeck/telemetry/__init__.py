"""GPU memory telemetry: rocm (pyrsmi + amdsmi), nvidia (NVML), cpu (psutil), chosen automatically."""

from __future__ import annotations

from tunedeck.telemetry.base import NO_DEVICES, BackendAbsent, Reading
from tunedeck.telemetry.cpu import CpuBackend
from tunedeck.telemetry.nvidia import NvidiaBackend
from tunedeck.telemetry.rocm import RocmBackend

__all__ = ["BackendAbsent", "Reading", "absence", "detect_gpus", "open_backend", "select"]
# Why a node shows no GPUs, for a page: on a CPU host the libraries' exceptions are the normal state.
NO_LIBRARY = "No GPU library on this node (neither AMD SMI nor NVIDIA's NVML loads): jobs run on the CPU."
NONE_FOUND = "The GPU library found no GPUs on this node: jobs run on the CPU."


def open_backend(*, gpus: bool = True, root_pid: int | None = None):
    """The first backend that opens: rocm, nvidia, then cpu. Returns (backend, reason GPUs are absent)."""
    reasons = []
    if gpus:
        for cls in (RocmBackend, NvidiaBackend):
            backend = cls()
            try:
                backend.open()
                return backend, None
            except BackendAbsent as e:
                reasons.append(str(e))
            except Exception as e:
                reasons.append(f"{cls.name}: {type(e).__name__}: {e}")
    else:
        reasons.append("the job runs on the CPU")
    cpu = CpuBackend(root_pid)
    cpu.open()
    return cpu, "; ".join(reasons)


def absence(reason: str | None) -> str | None:
    """`reason` (open_backend's: each library's own exception, for logs and scripts) as a sentence."""
    if not reason:
        return None
    return NONE_FOUND if NO_DEVICES in reason else NO_LIBRARY


def detect_gpus() -> tuple[str, str | None, list[Reading]]:
    """This host's GPUs: (backend name, why GPUs are absent, one reading per device)."""
    backend, reason = open_backend(gpus=True)
    try:
        return backend.name, reason, backend.devices() if backend.name != "cpu" else []
    finally:
        backend.close()


def select(readings: list[Reading], *, visible: list[int], bus_ids: list[str] | None = None) -> list[int]:
    """The SMI indices of a job's devices: by PCI bus id where known (SMI, HIP and ROCR indices can
    differ), else by the visible-device indices the scheduler assigned."""
    if bus_ids:
        by_bus = {r.bus_id: r.index for r in readings if r.bus_id}
        found = [by_bus[b] for b in bus_ids if b in by_bus]
        if found:
            return found
    known = {r.index for r in readings}
    return [i for i in visible if i in known]

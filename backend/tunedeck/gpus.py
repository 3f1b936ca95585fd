"""How many GPUs this node has, from the SMI libraries, without torch.

A missing or broken library means "no GPU of that kind": `import amdsmi` raises KeyError without
ROCm, pyrsmi raises ROCMLError_LibraryNotFound, NVML raises NVMLError_LibraryNotFound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Gpu:
    index: int
    name: str
    vendor: str  # amd | nvidia
    total_bytes: int | None = None


def _nvidia() -> list[Gpu]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(Gpu(i, name.decode() if isinstance(name, bytes) else name, "nvidia",
                           int(pynvml.nvmlDeviceGetMemoryInfo(h).total)))
        return out
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _amd() -> list[Gpu]:
    try:
        from pyrsmi import rocml

        rocml.smi_initialize()
    except Exception:
        return []
    try:
        out = []
        for i in range(rocml.smi_get_device_count()):
            total = rocml.smi_get_device_memory_total(i)
            out.append(Gpu(i, str(rocml.smi_get_device_name(i)), "amd", int(total) if total and total > 0 else None))
        return out
    except Exception:
        return []
    finally:
        try:
            rocml.smi_shutdown()
        except Exception:
            pass


def detect() -> list[Gpu]:
    """AMD first (the product's home), then NVIDIA."""
    return _amd() or _nvidia()

"""Probe of the training environment, run BY PATH with that environment's python (no tunedeck import).

Prints one JSON object: what the machine has (/opt/rocm, /dev/kfd, NVIDIA device files, SMI tools),
the relevant environment variables, the torch build and its devices, package versions, DeepSpeed's
compiled ops, flash-attn, and which SMI library initialises. Every probe is guarded: a broken
package is reported, never fatal (a CUDA extension on ROCm torch fails with "undefined symbol").
"""

import json
import os
import platform
import shutil
import socket
import sys
from typing import Any

ENV_KEYS = (
    "ROCM_PATH",
    "HIP_PATH",
    "PYTORCH_ROCM_ARCH",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OPTIM_TORCH",
)
PACKAGES = (
    "torch",
    "transformers",
    "llamafactory",
    "deepspeed",
    "peft",
    "accelerate",
    "flash_attn",
    "flash-attn",
    "amdsmi",
    "pyrsmi",
    "nvidia-ml-py",
    # LLaMA-Factory's predict metrics (BLEU/ROUGE) import these; tunedeck.checks.kinds names who needs them.
    "jieba",
    "nltk",
    "rouge-chinese",
)


def _err(e):
    return f"{type(e).__name__}: {e}"[:500]


def machine():
    rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
    return {
        "rocm_path": rocm if os.path.isdir(rocm) else None,
        "kfd": os.path.exists("/dev/kfd"),
        "dri": os.path.isdir("/dev/dri"),
        "nvidia_dev": os.path.exists("/dev/nvidiactl"),
        "amd_smi_tool": shutil.which("amd-smi") or shutil.which("rocm-smi"),
        "nvidia_smi_tool": shutil.which("nvidia-smi"),
    }


def versions():
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name.replace("-", "_")] = out.get(name.replace("-", "_")) or metadata.version(name)
        except Exception:
            out.setdefault(name.replace("-", "_"), None)
    return out


def torch_info():
    try:
        import torch
    except Exception as e:
        return {"error": _err(e)}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "hip": getattr(torch.version, "hip", None),
        "cuda": getattr(torch.version, "cuda", None),
        "devices": [],
    }
    try:
        info["is_available"] = bool(torch.cuda.is_available())
        info["arch_list"] = list(torch.cuda.get_arch_list()) if info["is_available"] else []
        for i in range(torch.cuda.device_count() if info["is_available"] else 0):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append(
                {
                    "index": i,
                    "name": p.name,
                    "total_bytes": int(p.total_memory),
                    "arch": getattr(p, "gcnArchName", None) or f"sm_{p.major}{p.minor}",
                }
            )
    except Exception as e:
        info["error"] = _err(e)
    return info


def deepspeed_info():
    # git_version_info is what `ds_report` reads: ops compiled at install (DS_BUILD_OPS) and the
    # torch/HIP it was built against; importing it does not import the whole of deepspeed.
    try:
        from deepspeed import git_version_info as g
    except Exception as e:
        return {"error": _err(e)}
    return {
        "version": getattr(g, "version", None),
        "installed_ops": sorted(k for k, v in (getattr(g, "installed_ops", None) or {}).items() if v),
        "built_torch": getattr(g, "torch_info", None),
    }


def flash_attn_info():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return {"installed": False}
    try:
        import flash_attn
        from flash_attn import flash_attn_func  # noqa: F401  (the kernel itself must import, not only the package)

        return {"installed": True, "importable": True, "version": getattr(flash_attn, "__version__", None)}
    except Exception as e:
        return {"installed": True, "importable": False, "error": _err(e)}


# Each GPU binding a sampler may use: its module, how to start it, count devices and stop it.
SMI = {
    "amdsmi": ("amdsmi", "amdsmi_init", lambda m: len(m.amdsmi_get_processor_handles()), "amdsmi_shut_down"),
    "pyrsmi": ("pyrsmi.rocml", "smi_initialize", lambda m: m.smi_get_device_count(), "smi_shutdown"),
    "pynvml": ("pynvml", "nvmlInit", lambda m: m.nvmlDeviceGetCount(), "nvmlShutdown"),
}


def smi_info():
    import importlib

    out = {}
    for name, (module, start, count, stop) in SMI.items():
        try:
            m = importlib.import_module(module)
            getattr(m, start)()
            out[name] = {"ok": True, "devices": int(count(m))}
            getattr(m, stop)()
        except Exception as e:
            out[name] = {"ok": False, "error": _err(e)}
    return out


def main():
    result = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "machine": machine(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "versions": versions(),
        "torch": torch_info(),
        "deepspeed": deepspeed_info(),
        "flash_attn": flash_attn_info(),
        "smi": smi_info(),
    }
    sys.stdout.write("\n@@PREFLIGHT@@" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

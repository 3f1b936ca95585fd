"""Preflight of the training environment: is this machine ready to train, and if not, what to fix.

The probe (preflight_probe.py) runs by path in the training environment's python, as a subprocess:
the server never imports torch or deepspeed, and a broken wheel ("undefined symbol") cannot take
the server down. Results are cached per python for `preflight_ttl_s`.

Each check is `{"name", "status": "ok"|"warn"|"fail"|"skip", "detail", "fix"}`; the result passes
when no check fails. Its `summary` says what the node is ("CPU only", "ROCm 6.2: 8× gfx90a").
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tunedeck.lint import lf_table

PROBE = Path(__file__).with_name("preflight_probe.py")
MARK = "@@PREFLIGHT@@"
_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_flights: dict[str, Future] = {}  # the probe running now, per python
_lock = threading.Lock()


class PreflightError(RuntimeError):
    pass


def probe(python: Path, *, timeout: float = 180.0) -> dict[str, Any]:
    """Run the probe; raise PreflightError when the python itself cannot run it."""
    try:
        out = subprocess.run(
            [str(python), str(PROBE)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PreflightError(f"cannot run the training python {python}: {e}") from None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
    raise PreflightError(f"the probe failed in {python} (exit {out.returncode}): {' | '.join(tail)}")


def _check(name: str, status: str, detail: str, fix: str = "") -> dict[str, str]:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


def _version_check(name: str, *, have: str | None, want: str | None, pin: str) -> dict:
    """A package the key tables were captured from: missing fails, another version warns."""
    if not have:
        return _check(name, "fail", f"{name} is not installed", f"pip install {name}{pin}")
    if have == want:
        return _check(name, "ok", f"{name} {have}")
    return _check(name, "warn", f"{name} {have}; tunedeck's key table was captured from {want}",
                  "re-run scripts/capture_lf_args.py with this environment")


def _arch(a: str | None) -> str:
    return (a or "").split(":")[0]  # "gfx90a:sramecc+:xnack-" → "gfx90a"


def evaluate(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn a probe result into red/green checks with fixes; pure, so tests can feed any probe dict."""
    m, env, t, v = raw.get("machine", {}), raw.get("env", {}), raw.get("torch", {}), raw.get("versions", {})
    amd_box = bool(m.get("kfd"))
    nvidia_box = bool(m.get("nvidia_dev") or m.get("nvidia_smi_tool"))
    hip, cuda = t.get("hip"), t.get("cuda")
    build = f"ROCm {hip}" if hip else f"CUDA {cuda}" if cuda else "CPU"
    devices = [{**d, "arch": _arch(d.get("arch"))} for d in t.get("devices") or []]
    checks = []

    # torch build against the machine
    if "error" in t and "version" not in t:
        checks.append(
            _check(
                "torch",
                "fail",
                f"torch does not import: {t['error']}",
                "install torch in the training environment (the ROCm wheel on AMD)",
            )
        )
    elif amd_box and not hip:
        checks.append(
            _check(
                "torch",
                "fail",
                f"torch {t.get('version')} is a {build} build on an AMD "
                "machine (/dev/kfd present): no GPU will be found, CUDA extensions fail with "
                "'undefined symbol'",
                "install the ROCm wheel: pip install torch --index-url "
                "https://download.pytorch.org/whl/rocm6.2 (match your ROCm)",
            )
        )
    elif nvidia_box and hip:
        checks.append(
            _check(
                "torch",
                "fail",
                f"torch {t.get('version')} is a ROCm build on an NVIDIA machine",
                "install the CUDA wheel of torch",
            )
        )
    else:
        checks.append(_check("torch", "ok", f"torch {t.get('version')} ({build} build)"))

    gpu_box = amd_box or nvidia_box
    if not gpu_box:
        checks.append(_check("gpu", "ok", "CPU only: no /dev/kfd, no NVIDIA device; jobs run on the CPU"))
    elif not t.get("is_available"):
        checks.append(
            _check(
                "gpu",
                "fail",
                "torch.cuda.is_available() is False on a GPU machine",
                "check the torch build above, that the user is in the video/render groups "
                "(AMD), and the visible-device variables",
            )
        )
    else:
        names = ", ".join(f"{d['index']}: {d['name']} {d['arch']}" for d in devices)
        checks.append(_check("gpu", "ok", f"{len(devices)} device(s): {names}"))

    if hip and devices:
        archs = sorted({d["arch"] for d in devices})
        built = {_arch(a) for a in t.get("arch_list") or []}
        missing = [a for a in archs if built and a not in built]
        if missing:
            checks.append(
                _check(
                    "arch",
                    "fail",
                    f"torch was built for {', '.join(sorted(built))}, not for "
                    f"{', '.join(missing)}: kernels fail with 'HIP error: invalid device function'",
                    "install a torch wheel built for this card",
                )
            )
        want = [
            a.strip() for a in (env.get("PYTORCH_ROCM_ARCH") or "").replace(",", ";").split(";") if a.strip()
        ]
        if want and set(archs) - set(want):
            checks.append(
                _check(
                    "PYTORCH_ROCM_ARCH",
                    "warn",
                    f"PYTORCH_ROCM_ARCH={env['PYTORCH_ROCM_ARCH']} but "
                    f"the cards are {', '.join(archs)}: extensions built now (DeepSpeed ops, "
                    "flash-attn) will not run on them",
                    f"export PYTORCH_ROCM_ARCH={';'.join(archs)}",
                )
            )
        elif not missing:
            checks.append(
                _check(
                    "arch",
                    "ok",
                    f"{', '.join(archs)}"
                    + (f" (PYTORCH_ROCM_ARCH={env['PYTORCH_ROCM_ARCH']})" if want else ""),
                )
            )
        rocm = env.get("ROCM_PATH") or m.get("rocm_path")
        checks.append(
            _check(
                "ROCM_PATH",
                "ok" if m.get("rocm_path") else "warn",
                f"ROCm at {rocm}"
                if m.get("rocm_path")
                else f"no ROCm folder at {rocm}: builds "
                "look for CUDA headers and the SMI library is not found",
                "" if m.get("rocm_path") else "install ROCm or export ROCM_PATH=/opt/rocm-<version>",
            )
        )

    vis = {
        k: env.get(k)
        for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
        if env.get(k) is not None
    }
    if (
        hip
        and vis.get("HIP_VISIBLE_DEVICES") is not None
        and vis.get("CUDA_VISIBLE_DEVICES") is not None
        and vis["HIP_VISIBLE_DEVICES"] != vis["CUDA_VISIBLE_DEVICES"]
    ):
        checks.append(
            _check(
                "visible devices",
                "fail",
                f"HIP_VISIBLE_DEVICES={vis['HIP_VISIBLE_DEVICES']} and "
                f"CUDA_VISIBLE_DEVICES={vis['CUDA_VISIBLE_DEVICES']} disagree: HIP honours both",
                "set only HIP_VISIBLE_DEVICES (or make them equal)",
            )
        )
    elif hip and "ROCR_VISIBLE_DEVICES" in vis:
        checks.append(
            _check(
                "visible devices",
                "warn",
                f"ROCR_VISIBLE_DEVICES={vis['ROCR_VISIBLE_DEVICES']}: it "
                "renumbers devices below HIP, and Ray refuses it alone",
                "use HIP_VISIBLE_DEVICES instead",
            )
        )
    elif hip and vis.get("CUDA_VISIBLE_DEVICES") is not None and "HIP_VISIBLE_DEVICES" not in vis:
        checks.append(_check("visible devices", "ok", "CUDA_VISIBLE_DEVICES (HIP honours it too)"))
    else:
        checks.append(
            _check("visible devices", "ok", ", ".join(f"{k}={x}" for k, x in vis.items()) or "all visible")
        )

    ds = raw.get("deepspeed") or {}
    if ds.get("version"):
        ops = ", ".join(ds.get("installed_ops") or []) or "none (JIT-compiled at first use)"
        checks.append(_check("deepspeed", "ok", f"deepspeed {ds['version']}; precompiled ops: {ops}"))
    else:
        checks.append(
            _check(
                "deepspeed",
                "warn",
                f"deepspeed not importable: {ds.get('error', 'not installed')}; DeepSpeed jobs will fail",
                "DS_BUILD_OPS=0 pip install deepspeed",
            )
        )

    lf_want, tf_want = lf_table()["llamafactory_version"], lf_table().get("transformers_version")
    for name, want, pin in (("llamafactory", lf_want, f"=={lf_want}"), ("transformers", tf_want, "")):
        checks.append(_version_check(name, have=v.get(name), want=want, pin=pin))

    fa = raw.get("flash_attn") or {}
    if not fa.get("installed"):
        checks.append(
            _check(
                "flash-attn",
                "skip",
                "not installed: attention runs on SDPA",
                "optional: a flash-attn build for this GPU (ROCm: the ROCm/flash-attention fork)",
            )
        )
    elif not fa.get("importable"):
        checks.append(
            _check(
                "flash-attn",
                "warn",
                f"installed but does not load: {fa.get('error')}",
                "rebuild flash-attn against this torch and GPU arch, or uninstall it",
            )
        )
    else:
        checks.append(_check("flash-attn", "ok", f"flash-attn {fa.get('version')}"))

    smi = raw.get("smi") or {}
    ok = [k for k, s in smi.items() if s.get("ok")]
    if ok:
        checks.append(_check("smi", "ok", f"{', '.join(ok)} reachable: GPU memory is sampled"))
    elif gpu_box:
        lib = "amdsmi / pyrsmi (libamd_smi.so under $ROCM_PATH/lib)" if amd_box else "nvidia-ml-py"
        checks.append(
            _check("smi", "warn", "no SMI library initialises: no GPU memory telemetry", f"install {lib}")
        )
    else:
        checks.append(_check("smi", "ok", "no GPU: memory is sampled with psutil"))

    backend = "rocm" if hip and devices else "cuda" if cuda and devices else "cpu"
    if backend == "cpu":
        summary = "CPU only" + (f" (torch {build} build)" if build != "CPU" else "")
    else:
        archs = sorted({d["arch"] for d in devices})
        summary = f"{build}: {len(devices)}× {', '.join(archs)}"
    return {
        "ok": not any(c["status"] == "fail" for c in checks),
        "summary": summary,
        "backend": backend,
        "hostname": raw.get("hostname"),
        "python": raw.get("python"),
        "devices": devices,
        "packages": {k: v.get(k) for k in ("torch", "transformers", "llamafactory", "deepspeed", "peft")}
        | {"flash_attn": bool(fa.get("importable"))},
        "checks": checks,
    }


def _unusable(python: Path, e: PreflightError) -> dict[str, Any]:
    return {
        "ok": False,
        "summary": "training environment unusable",
        "backend": None,
        "devices": [],
        "hostname": None,
        "python": str(python),
        "packages": {},
        "checks": [
            _check(
                "python",
                "fail",
                str(e),
                "set TUNEDECK_TRAIN_PYTHON to the python LLaMA-Factory is installed in",
            )
        ],
    }


def run(python: Path, *, ttl: float, refresh: bool = False, refresh_min_s: float = 0.0) -> dict[str, Any]:
    """The evaluated preflight of a training python, cached for `ttl` seconds.

    One probe at a time per python: callers that come while it runs wait for it and share its result
    (each probe imports torch, seconds of CPU). A refresh within `refresh_min_s` of the last probe
    gets that probe's result too, so a page reloaded in a loop cannot keep the CPU busy."""
    key = str(python)
    with _lock:
        hit = _cache.get(key)
        age = time.time() - hit[0] if hit else None
        if age is not None and age < (min(refresh_min_s, ttl) if refresh else ttl):
            return hit[1]
        flight = _flights.get(key)
        leader = flight is None
        if leader:
            flight = _flights[key] = Future()
    if not leader:
        return flight.result()
    try:
        try:
            result = evaluate(probe(python))
        except PreflightError as e:
            result = _unusable(python, e)
        result["checked_at"] = time.time()
        with _lock:
            _cache[key] = (time.time(), result)
        flight.set_result(result)
    except BaseException as e:
        flight.set_exception(e)
        raise
    finally:
        with _lock:
            _flights.pop(key, None)
    return result


def cached(python: Path, *, ttl: float) -> dict[str, Any] | None:
    """The cached result if fresh, without running anything (for lint at submission)."""
    with _lock:
        hit = _cache.get(str(python))
    return hit[1] if hit and time.time() - hit[0] < ttl else None

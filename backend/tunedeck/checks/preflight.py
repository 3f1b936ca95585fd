"""Preflight of the training environment: is this machine ready to train, and if not, what to fix.

The probe (tunedeck_train/preflight_probe.py) runs by path in the training environment's python, as a subprocess:
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunedeck import procs
from tunedeck.checks import kinds
from tunedeck.checks.tables import lf_table

# Found, not imported: it imports torch and deepspeed, which nothing under tunedeck may.
PROBE = procs.script("tunedeck_train.preflight_probe")
MARK = "@@PREFLIGHT@@"
_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_flights: dict[str, Future[dict[str, Any]]] = {}  # the probe running now, per python
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
    return _check(
        name,
        "warn",
        f"{name} {have}; tunedeck's key table was captured from {want}",
        "re-run scripts/capture_lf_args.py with this environment",
    )


def _arch(a: str | None) -> str:
    return (a or "").split(":")[0]  # "gfx90a:sramecc+:xnack-" → "gfx90a"


@dataclass(frozen=True)
class Probe:
    """A probe result with the facts several checks share, worked out once."""

    raw: dict[str, Any]
    machine: dict[str, Any]
    env: dict[str, Any]
    torch: dict[str, Any]
    versions: dict[str, Any]
    amd_box: bool
    nvidia_box: bool
    hip: str | None
    cuda: str | None
    build: str
    devices: list[dict[str, Any]]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Probe:
        m, t = raw.get("machine", {}), raw.get("torch", {})
        hip, cuda = t.get("hip"), t.get("cuda")
        return cls(
            raw=raw,
            machine=m,
            env=raw.get("env", {}),
            torch=t,
            versions=raw.get("versions", {}),
            amd_box=bool(m.get("kfd")),
            nvidia_box=bool(m.get("nvidia_dev") or m.get("nvidia_smi_tool")),
            hip=hip,
            cuda=cuda,
            build=f"ROCm {hip}" if hip else f"CUDA {cuda}" if cuda else "CPU",
            devices=[{**d, "arch": _arch(d.get("arch"))} for d in t.get("devices") or []],
        )

    @property
    def gpu_box(self) -> bool:
        return self.amd_box or self.nvidia_box

    @property
    def archs(self) -> list[str]:
        return sorted({d["arch"] for d in self.devices})


Findings = list[dict[str, str]]


def check_torch(p: Probe) -> Findings:
    """The torch build against the machine: a CUDA wheel on an AMD box finds no GPU."""
    t = p.torch
    if "error" in t and "version" not in t:
        return [
            _check(
                "torch",
                "fail",
                f"torch does not import: {t['error']}",
                "install torch in the training environment (the ROCm wheel on AMD)",
            )
        ]
    if p.amd_box and not p.hip:
        return [
            _check(
                "torch",
                "fail",
                f"torch {t.get('version')} is a {p.build} build on an AMD "
                "machine (/dev/kfd present): no GPU will be found, CUDA extensions fail with "
                "'undefined symbol'",
                "install the ROCm wheel: pip install torch --index-url "
                "https://download.pytorch.org/whl/rocm6.2 (match your ROCm)",
            )
        ]
    if p.nvidia_box and p.hip:
        return [
            _check(
                "torch",
                "fail",
                f"torch {t.get('version')} is a ROCm build on an NVIDIA machine",
                "install the CUDA wheel of torch",
            )
        ]
    return [_check("torch", "ok", f"torch {t.get('version')} ({p.build} build)")]


def check_gpu(p: Probe) -> Findings:
    if not p.gpu_box:
        return [_check("gpu", "ok", "CPU only: no /dev/kfd, no NVIDIA device; jobs run on the CPU")]
    if not p.torch.get("is_available"):
        return [
            _check(
                "gpu",
                "fail",
                "torch.cuda.is_available() is False on a GPU machine",
                "check the torch build above, that the user is in the video/render groups "
                "(AMD), and the visible-device variables",
            )
        ]
    names = ", ".join(f"{d['index']}: {d['name']} {d['arch']}" for d in p.devices)
    return [_check("gpu", "ok", f"{len(p.devices)} device(s): {names}")]


def check_arch(p: Probe) -> Findings:
    """ROCm: torch built for the cards, and PYTORCH_ROCM_ARCH naming them for extension builds."""
    if not (p.hip and p.devices):
        return []
    found: Findings = []
    env, archs = p.env, p.archs
    built = {_arch(a) for a in p.torch.get("arch_list") or []}
    missing = [a for a in archs if built and a not in built]
    if missing:
        found.append(
            _check(
                "arch",
                "fail",
                f"torch was built for {', '.join(sorted(built))}, not for "
                f"{', '.join(missing)}: kernels fail with 'HIP error: invalid device function'",
                "install a torch wheel built for this card",
            )
        )
    want = [a.strip() for a in (env.get("PYTORCH_ROCM_ARCH") or "").replace(",", ";").split(";") if a.strip()]
    if want and set(archs) - set(want):
        found.append(
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
        pinned = f" (PYTORCH_ROCM_ARCH={env['PYTORCH_ROCM_ARCH']})" if want else ""
        found.append(_check("arch", "ok", f"{', '.join(archs)}{pinned}"))
    return found


def check_rocm_path(p: Probe) -> Findings:
    if not (p.hip and p.devices):
        return []
    rocm = p.env.get("ROCM_PATH") or p.machine.get("rocm_path")
    if p.machine.get("rocm_path"):
        return [_check("ROCM_PATH", "ok", f"ROCm at {rocm}")]
    return [
        _check(
            "ROCM_PATH",
            "warn",
            f"no ROCm folder at {rocm}: builds look for CUDA headers and the SMI library is not found",
            "install ROCm or export ROCM_PATH=/opt/rocm-<version>",
        )
    ]


def check_visible_devices(p: Probe) -> Findings:
    """HIP honours both HIP_ and CUDA_VISIBLE_DEVICES, so they must agree; ROCR_ renumbers below HIP."""
    vis = {
        k: p.env.get(k)
        for k in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
        if p.env.get(k) is not None
    }
    hip_vis, cuda_vis = vis.get("HIP_VISIBLE_DEVICES"), vis.get("CUDA_VISIBLE_DEVICES")
    if p.hip and hip_vis is not None and cuda_vis is not None and hip_vis != cuda_vis:
        return [
            _check(
                "visible devices",
                "fail",
                f"HIP_VISIBLE_DEVICES={hip_vis} and CUDA_VISIBLE_DEVICES={cuda_vis} disagree: HIP honours both",
                "set only HIP_VISIBLE_DEVICES (or make them equal)",
            )
        ]
    if p.hip and "ROCR_VISIBLE_DEVICES" in vis:
        return [
            _check(
                "visible devices",
                "warn",
                f"ROCR_VISIBLE_DEVICES={vis['ROCR_VISIBLE_DEVICES']}: it "
                "renumbers devices below HIP, and Ray refuses it alone",
                "use HIP_VISIBLE_DEVICES instead",
            )
        ]
    if p.hip and cuda_vis is not None and "HIP_VISIBLE_DEVICES" not in vis:
        return [_check("visible devices", "ok", "CUDA_VISIBLE_DEVICES (HIP honours it too)")]
    return [_check("visible devices", "ok", ", ".join(f"{k}={x}" for k, x in vis.items()) or "all visible")]


def check_deepspeed(p: Probe) -> Findings:
    ds = p.raw.get("deepspeed") or {}
    if ds.get("version"):
        ops = ", ".join(ds.get("installed_ops") or []) or "none (JIT-compiled at first use)"
        return [_check("deepspeed", "ok", f"deepspeed {ds['version']}; precompiled ops: {ops}")]
    return [
        _check(
            "deepspeed",
            "warn",
            f"deepspeed not importable: {ds.get('error', 'not installed')}; DeepSpeed jobs will fail",
            "DS_BUILD_OPS=0 pip install deepspeed",
        )
    ]


def check_key_table_versions(p: Probe) -> Findings:
    """The packages tunedeck's key tables were captured from (lint trusts them)."""
    lf_want, tf_want = lf_table()["llamafactory_version"], lf_table().get("transformers_version")
    return [
        _version_check(name, have=p.versions.get(name), want=want, pin=pin)
        for name, want, pin in (("llamafactory", lf_want, f"=={lf_want}"), ("transformers", tf_want, ""))
    ]


def check_flash_attn(p: Probe) -> Findings:
    fa = p.raw.get("flash_attn") or {}
    if not fa.get("installed"):
        return [
            _check(
                "flash-attn",
                "skip",
                "not installed: attention runs on SDPA",
                "optional: a flash-attn build for this GPU (ROCm: the ROCm/flash-attention fork)",
            )
        ]
    if not fa.get("importable"):
        return [
            _check(
                "flash-attn",
                "warn",
                f"installed but does not load: {fa.get('error')}",
                "rebuild flash-attn against this torch and GPU arch, or uninstall it",
            )
        ]
    return [_check("flash-attn", "ok", f"flash-attn {fa.get('version')}")]


def check_smi(p: Probe) -> Findings:
    """An SMI library that initialises: without one a GPU box has no memory telemetry."""
    ok = [k for k, s in (p.raw.get("smi") or {}).items() if s.get("ok")]
    if ok:
        return [_check("smi", "ok", f"{', '.join(ok)} reachable: GPU memory is sampled")]
    if p.gpu_box:
        lib = "amdsmi / pyrsmi (libamd_smi.so under $ROCM_PATH/lib)" if p.amd_box else "nvidia-ml-py"
        return [
            _check("smi", "warn", "no SMI library initialises: no GPU memory telemetry", f"install {lib}")
        ]
    return [_check("smi", "ok", "no GPU: memory is sampled with psutil")]


def check_kind_packages(p: Probe) -> Findings:
    """Packages a job kind needs beyond training: one check per package, naming the kinds."""
    out = []
    for package, needed_by in kinds.packages_needed().items():
        have = p.versions.get(package.replace("-", "_"))
        who = ", ".join(needed_by)
        if have:
            out.append(_check(package, "ok", f"{package} {have} ({who} jobs)"))
        else:
            out.append(
                _check(
                    package,
                    "warn",
                    f"{package} is not installed: {who} jobs fail (LLaMA-Factory's BLEU/ROUGE metrics import it)",
                    f"pip install {package} in the training environment (scripts/setup.sh does)",
                )
            )
    return out


# In the order the page and `tunedeck doctor` list them.
CHECKS = (
    check_torch,
    check_gpu,
    check_arch,
    check_rocm_path,
    check_visible_devices,
    check_deepspeed,
    check_key_table_versions,
    check_flash_attn,
    check_smi,
    check_kind_packages,
)


def _backend(p: Probe) -> str:
    return "rocm" if p.hip and p.devices else "cuda" if p.cuda and p.devices else "cpu"


def _summary(p: Probe) -> str:
    if _backend(p) == "cpu":
        return "CPU only" + (f" (torch {p.build} build)" if p.build != "CPU" else "")
    return f"{p.build}: {len(p.devices)}× {', '.join(p.archs)}"


def evaluate(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn a probe result into red/green checks with fixes; pure, so tests can feed any probe dict."""
    p = Probe.of(raw)
    checks = [finding for check in CHECKS for finding in check(p)]
    fa = raw.get("flash_attn") or {}
    packages = ("torch", "transformers", "llamafactory", "deepspeed", "peft")
    return {
        "ok": not any(c["status"] == "fail" for c in checks),
        "summary": _summary(p),
        "backend": _backend(p),
        "hostname": raw.get("hostname"),
        "python": raw.get("python"),
        "devices": p.devices,
        "packages": {k: p.versions.get(k) for k in packages}
        | {"flash_attn": bool(fa.get("importable"))}
        | {k.replace("-", "_"): p.versions.get(k.replace("-", "_")) for k in kinds.packages_needed()},
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
        if hit is not None and time.time() - hit[0] < (min(refresh_min_s, ttl) if refresh else ttl):
            return hit[1]
        flight = _flights.get(key)
        leader = flight is None
        if flight is None:
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

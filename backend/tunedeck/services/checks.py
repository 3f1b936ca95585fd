"""Checks before launch for a JobSpec (lint, VRAM estimate) and predicted-vs-measured after it."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

from sqlalchemy import text
from sqlmodel import Session, select

from tunedeck import estimate as est
from tunedeck import lint, preflight, reach
from tunedeck import spec as specs
from tunedeck.config import Settings
from tunedeck.models import EstimateCalibration, Job, JobSpec, MetricPoint
from tunedeck.telemetry import detect_gpus

GiB = 2**30


class NoModelConfig(ValueError):
    pass


def resolve_ds(value: Any, settings: Settings) -> tuple[dict[str, Any] | None, list[dict]]:
    """The spec's DeepSpeed config as a dict (preset, file or inline); unreadable ones are left to the spec."""
    errors: list[dict] = []
    ds = specs._deepspeed(value, settings, errors, [])
    return ds, errors


def _split(spec: JobSpec) -> tuple[dict[str, Any], Any]:
    config = dict(spec.config)
    ds = spec.deepspeed if spec.deepspeed is not None else config.pop("deepspeed", None)
    config.pop("deepspeed", None)
    return config, ds


def model_config_of(config: dict[str, Any], settings: Settings) -> dict[str, Any] | None:
    """config.json of the spec's model: a folder inside the allowed roots, or a hub id in the HF cache."""
    model = config.get("model_name_or_path")
    if not isinstance(model, str):
        return None
    local = specs.confine(model, settings)
    if local is not None and (local / "config.json").is_file():
        return lint.read_model_config(str(local))
    return lint.read_model_config(model, hub_only=True) if specs.HUB_ID.fullmatch(model) else None


def lint_spec(
    spec: JobSpec,
    *,
    settings: Settings,
    node_gpus: int | None = None,
    node_preflight: dict[str, Any] | None = None,
) -> list[dict]:
    """Every finding for a submitted spec; hardware checks only with a preflight of the node."""
    config, ds_value = _split(spec)
    ds, _ = resolve_ds(ds_value, settings)
    specs.bound(config, ds, settings)
    gpus = spec.gpus if spec.gpus is not None else (1 if (node_gpus or 0) > 0 else 0)
    found = lint.lint(
        config, ds, gpus=gpus, preflight=node_preflight, model_config=model_config_of(config, settings)
    )
    found += reach.check(copy.deepcopy(config), copy.deepcopy(ds), settings).findings
    return sorted(found, key=lambda f: lint.SEVERITIES.index(f["severity"]))


def node_preflight(settings: Settings) -> dict[str, Any] | None:
    """The node's preflight when one is cached (submission never waits for the probe)."""
    return preflight.cached(settings.train_python, ttl=settings.preflight_ttl_s)


def warm_preflight(settings: Settings) -> None:
    """Run the node's preflight in the background (a subprocess; the server does not wait)."""
    threading.Thread(
        target=preflight.run,
        args=(settings.train_python,),
        kwargs={"ttl": settings.preflight_ttl_s},
        name="preflight",
        daemon=True,
    ).start()


def estimate_spec(
    spec: JobSpec, *, settings: Settings, node_gpus: int | None = None, device_total_bytes: int | None = None
) -> dict[str, Any]:
    config, ds_value = _split(spec)
    ds, _ = resolve_ds(ds_value, settings)
    specs.bound(config, ds, settings)
    model_config = model_config_of(config, settings)
    if model_config is None:
        raise NoModelConfig(
            f"no readable config.json for model {config.get('model_name_or_path')!r} "
            "(a folder inside the allowed roots, or a hub id already in the HF cache)"
        )
    gpus = spec.gpus if spec.gpus is not None else (1 if (node_gpus or 0) > 0 else 0)
    return est.estimate(
        model_config=model_config, config=config, ds=ds, gpus=gpus, device_total_bytes=device_total_bytes
    )


def estimate_for_job(
    spec: JobSpec, *, settings: Settings, node_gpus: int, device_total_bytes: int | None
) -> str | None:
    """The estimate to store with a new job (JSON), or None when the model's shapes are unknown."""
    try:
        return json.dumps(
            estimate_spec(spec, settings=settings, node_gpus=node_gpus, device_total_bytes=device_total_bytes)
        )
    except (NoModelConfig, est.EstimateError):
        return None


def measured_peak(session: Session, job: Job) -> dict[str, Any] | None:
    """The job's measured peak per GPU: sampled device memory if recorded, else LLaMA-Factory's
    `vram_reserved` (GiB, main rank). On the CPU the host samples (gpu -1) stand in."""
    row = session.execute(
        text(
            "SELECT gpu, MAX(used_bytes), MAX(name) FROM memory_samples WHERE job_id = :j "
            "GROUP BY gpu ORDER BY MAX(used_bytes) DESC LIMIT 1"
        ),
        {"j": job.id},
    ).first()
    if row is not None and row[1]:
        kind = "cpu" if row[0] == -1 else (row[2] or "gpu")
        return {"bytes": int(row[1]), "source": "memory_samples", "gpu_kind": kind}
    peak = session.exec(
        select(MetricPoint.vram_reserved)
        .where(MetricPoint.job_id == job.id)
        .order_by(MetricPoint.vram_reserved.desc())
        .limit(1)
    ).first()  # type: ignore[union-attr]
    if peak is not None and peak > 0:
        return {"bytes": int(peak * GiB), "source": "vram_reserved", "gpu_kind": "gpu" if job.gpus else "cpu"}
    return None


def job_estimate(session: Session, job: Job) -> dict[str, Any]:
    """Predicted against measured for one job; a finished job's pair is recorded for calibration."""
    predicted = json.loads(job.estimate) if job.estimate else None
    measured = measured_peak(session, job)
    out = {"job_id": job.id, "estimate": predicted, "measured": measured, "ratio": None}
    if predicted and measured:
        out["ratio"] = measured["bytes"] / predicted["per_gpu_bytes"]
        if (
            job.status.finished
            and session.exec(
                select(EstimateCalibration.id).where(EstimateCalibration.job_id == job.id)
            ).first()
            is None
        ):
            session.add(
                EstimateCalibration(
                    job_id=job.id,
                    gpu_kind=measured["gpu_kind"],
                    predicted_bytes=predicted["per_gpu_bytes"],
                    measured_bytes=measured["bytes"],
                    source=measured["source"],
                    ratio=out["ratio"],
                )
            )
            session.commit()
    return out


def calibration(session: Session) -> list[dict[str, Any]]:
    """Per GPU kind: how many finished jobs, and the mean and range of measured / predicted."""
    rows = session.execute(
        text(
            "SELECT gpu_kind, COUNT(*), AVG(ratio), MIN(ratio), MAX(ratio) "
            "FROM estimate_calibrations GROUP BY gpu_kind ORDER BY gpu_kind"
        )
    ).all()
    return [
        {"gpu_kind": r[0], "jobs": r[1], "mean_ratio": r[2], "min_ratio": r[3], "max_ratio": r[4]}
        for r in rows
    ]


def node_device_total(node_gpus: int) -> int | None:
    """The smallest GPU of this node (what a job must fit in); None on a CPU node."""
    return device_total(detect_gpus()[2]) if node_gpus else None


def device_total(node_gpus_info: list[Any]) -> int | None:
    totals = [g.total_bytes for g in node_gpus_info if getattr(g, "total_bytes", None)]
    return min(totals) if totals else None

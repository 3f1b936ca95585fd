"""What eval, predict and export jobs leave in their output folder, read for the API and the job page.

LLaMA-Factory writes `<split>_results.json` (and `all_results.json`, their union) at the end of a
run, `generated_predictions.jsonl` (prompt, predict, label per line) after a predict, and an export
job's merged model is the whole folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tunedeck.services.jobs.records import run_files
from tunedeck.store.tables import Job

RESULT_FILES = ("train_results.json", "eval_results.json", "predict_results.json")
PREDICTIONS = "generated_predictions.jsonl"
WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")
MAX_RESULT_BYTES = 1 << 20


def _numbers(path: Path) -> dict[str, float]:
    """The finite numbers of one results file (a diverged run writes NaN, which JSON clients refuse)."""
    if not path.is_file() or path.stat().st_size > MAX_RESULT_BYTES:
        return {}
    try:
        data = json.loads(path.read_text(errors="replace"))
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def metrics(job: Job) -> list[dict[str, Any]]:
    """One row per number in the job's results files: `{split, name, value}`, train first."""
    out = Path(job.output_dir) if job.output_dir else None
    rows = []
    for name in RESULT_FILES:
        split = name.removesuffix("_results.json")
        for key, value in (_numbers(out / name) if out else {}).items():
            rows.append({"split": split, "name": key.removeprefix(f"{split}_"), "value": value})
    return rows


def predictions(job: Job, *, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
    """Rows `offset..offset+limit` of generated_predictions.jsonl and the file's row count."""
    path = Path(job.output_dir) / PREDICTIONS if job.output_dir else None
    if path is None or not path.is_file():
        return [], 0
    rows, total = [], 0
    with path.open(errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            if offset <= total < offset + limit:
                try:
                    d = json.loads(line)
                except ValueError:
                    d = {}
                d = d if isinstance(d, dict) else {}
                rows.append(
                    {
                        "index": total,
                        "prompt": str(d.get("prompt", "")),
                        "label": str(d.get("label", "")),
                        "prediction": str(d.get("predict", "")),
                    }
                )
            total += 1
    return rows, total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def weights_bytes(path: Path) -> int:
    """The weight files at the top of a model or adapter folder (its checkpoint-N/ subfolders are not it)."""
    return sum(
        p.stat().st_size
        for p in path.iterdir()
        if p.is_file() and p.name.endswith(WEIGHTS) and not p.name.startswith("training_args")
    )


def export_summary(job: Job) -> dict[str, Any] | None:
    """An export job's files and size, against the base model's and the adapter's weights."""
    if job.kind != "export" or not job.output_dir:
        return None
    out = Path(job.output_dir)
    config = job.config()

    def weights(key: str) -> int | None:
        # The rendered config holds paths as checked at submit: absolute, inside the allowed roots.
        value = config.get(key)
        path = Path(value) if isinstance(value, str) and Path(value).is_absolute() else None
        return weights_bytes(path) if path is not None and path.is_dir() else None

    return {
        "files": run_files(job),
        "total_bytes": folder_bytes(out) if out.is_dir() else 0,
        "weights_bytes": weights_bytes(out) if out.is_dir() else 0,
        "base_weights_bytes": weights("model_name_or_path"),
        "adapter_weights_bytes": weights("adapter_name_or_path"),
    }

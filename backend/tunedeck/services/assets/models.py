"""The local models this server can train: folders inside the allowed roots that hold a config.json
and weights, and the models in the Hugging Face cache, each with its architecture, parameter count,
dtype and the chat template LLaMA-Factory needs for it (the captured template table).

Nothing is loaded: the parameter count comes from the safetensors headers (an 8-byte length, then a
JSON header of every tensor's dtype and shape), so a 70B model costs a few header reads. The walk is
bounded like the dataset walk (folders looked into, depth).
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from tunedeck.checks import hubcache
from tunedeck.checks.tables import fitting_templates
from tunedeck.config import Settings

DEPTH = 3  # levels below a root looked into: <root>/models/<org>/<name> is 3
MAX_FOLDERS = 2000  # folders looked into per walk, over every root together
CONFIG_MAX = 16 << 20  # a config.json larger than this is no model config (as the submit check holds)
HEADER_MAX = 100 << 20  # a safetensors header larger than this is not read
WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")


def models(settings: Settings) -> list[dict[str, Any]]:
    """Every model folder of the roots (the workspace first), then the HF cache's models."""
    runs = settings.runs_dir.resolve()
    seen: set[Path] = set()
    found: list[dict[str, Any]] = []
    budget = [MAX_FOLDERS]
    for root in settings.roots:
        _walk(root, DEPTH, runs, seen, found, budget)
    cache = hubcache.hub_cache()
    try:
        repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        repos = []
    for repo in repos[:MAX_FOLDERS]:
        snap = hubcache.snapshot_of(repo)
        if snap is not None and (snap / "config.json").is_file() and snap.resolve() not in seen:
            seen.add(snap.resolve())
            hub_id = repo.name[len("models--") :].replace("--", "/")
            found.append(describe(snap, source="hf_cache", hub_id=hub_id))
    return found


def _walk(folder: Path, depth: int, runs: Path, seen: set[Path], found: list, budget: list[int]) -> None:
    try:
        real = folder.resolve()
    except OSError:
        return
    if real in seen or real == runs or budget[0] <= 0:
        return
    seen.add(real)
    budget[0] -= 1
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)
    except OSError:
        return
    names = {e.name for e in entries}
    if "config.json" in names and any(n.endswith(WEIGHTS) for n in names):
        found.append(describe(real, source="roots"))
        return  # a model's subfolders are its own (checkpoints, onnx exports)
    if depth == 0:
        return
    for e in entries:
        if e.name.startswith(".") or e.name in ("__pycache__", "node_modules"):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                _walk(Path(e.path), depth - 1, runs, seen, found, budget)
        except OSError:
            continue


def describe(folder: Path, *, source: str, hub_id: str | None = None) -> dict[str, Any]:
    """One model folder: what its config.json and its weights' headers say."""
    row: dict[str, Any] = {
        "path": str(folder),
        "name": hub_id or folder.name,
        "source": source,
        "hub_id": hub_id,
        "model_type": None,
        "architecture": None,
        "dtype": None,
        "parameters": None,
        "templates": [],
        "problem": None,
    }
    try:
        if (folder / "config.json").stat().st_size > CONFIG_MAX:
            raise ValueError("config.json is too large to be a model config")
        config = json.loads((folder / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("config.json is not a JSON object")
    except (OSError, ValueError) as e:
        row["problem"] = f"no readable config.json: {e}"
        return row
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else {}
    archs = config.get("architectures")
    row["model_type"] = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    row["architecture"] = (
        archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    )
    dtype = config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    row["dtype"] = dtype if isinstance(dtype, str) else None
    row["templates"] = fitting_templates(config)
    try:
        count, stored = parameters(folder)
    except (OSError, ValueError) as e:
        row["problem"] = f"cannot read the weights' headers: {e}"
    else:
        row["parameters"] = count
        row["dtype"] = row["dtype"] or stored
    return row


def parameters(folder: Path) -> tuple[int | None, str | None]:
    """Parameters in the folder's safetensors files (the index's shards, else every file) and the
    dtype most of them are stored in; (None, None) where the weights are not safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        files = sorted({folder / f for f in weight_map.values() if isinstance(f, str) and "/" not in f})
    else:
        files = sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("adapter_"))
    if not files:
        return None, None
    total = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        for name, info in _header(f).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            n = math.prod(int(d) for d in info.get("shape") or [])
            total += n
            by_dtype[str(info.get("dtype"))] = by_dtype.get(str(info.get("dtype")), 0) + n
    stored = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
    return total, names.get(stored or "", stored)


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name} is not a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > HEADER_MAX:
            raise ValueError(f"{path.name}: a header of {size} bytes")
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: its header is not a JSON object")
    return header

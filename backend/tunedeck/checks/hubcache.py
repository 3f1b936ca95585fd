"""Where a hub id already lies on this host: the Hugging Face caches, found the way huggingface_hub
and datasets find them (HF_HUB_CACHE, HF_DATASETS_CACHE, HF_HOME, XDG_CACHE_HOME), without
importing either. Runs are offline (HF_HUB_OFFLINE=1) unless the server allows the hub, so a hub
id that is not here cannot load.
"""

from __future__ import annotations

import os
from pathlib import Path


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def hub_cache() -> Path:
    """The folder of `models--org--name` / `datasets--org--name` repositories."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    return _hf_home() / "hub"


def datasets_cache() -> Path:
    """The folder where `datasets` keeps prepared datasets (`org___name`)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return _hf_home() / "datasets"


def snapshot_of(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` points to, else the newest one."""
    snapshots = repo_dir / "snapshots"
    try:
        ref = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        ref = ""
    if ref and (snapshots / ref).is_dir():
        return snapshots / ref
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def snapshot(repo_id: str, *, kind: str = "model", cache_dir: Path | None = None) -> Path | None:
    """The local copy of a hub repository (`kind` model or dataset), or None when there is none.
    `cache_dir` is a job's own `cache_dir`: LLaMA-Factory passes it to both libraries, which then
    look nowhere else."""
    folder = f"{kind}s--{repo_id.replace('/', '--')}"
    if cache_dir is not None:
        roots = [cache_dir]
    else:
        roots = [hub_cache(), datasets_cache()] if kind == "dataset" else [hub_cache()]
    for root in roots:
        found = snapshot_of(root / folder)
        if found is not None:
            return found
        if kind == "dataset":  # a dataset `datasets` prepared itself: `org___name/<config>/...`
            prepared = root / repo_id.replace("/", "___")
            if prepared.is_dir():
                return prepared
    return None

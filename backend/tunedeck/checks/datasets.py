"""The dataset folders this server can see: each folder inside the allowed roots (the workspace's
`data` first) that holds a dataset_info.json, found a few levels down, never in the run folders.

A refused `dataset` names what exists and where; `GET /api/datasets` lists them. The walk is bounded
(folders looked into, depth), so a root over a large share costs a bounded number of directory reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunedeck.config import Settings

DATASET_INFO = "dataset_info.json"
DEPTH = 3  # levels below a root looked into: <root>/<project>/<data>/dataset_info.json is 2
MAX_FOLDERS = 2000  # folders looked into per walk, over every root together


@dataclass(frozen=True)
class Folder:
    """A folder with a dataset_info.json, and the names it defines ({} where it cannot be read)."""

    path: Path
    names: dict[str, Any]
    problem: str | None = None  # why its dataset_info.json could not be read


def folders(settings: Settings) -> list[Folder]:
    """Every dataset folder in the roots, the workspace's `data` first, each once."""
    runs = settings.runs_dir.resolve()
    seen: set[Path] = set()
    found: list[Folder] = []
    budget = [MAX_FOLDERS]
    for start in [settings.workspace / "data", *settings.roots]:
        _walk(Path(start), DEPTH, runs, seen, found, budget)
    return found


def _walk(
    folder: Path, depth: int, runs: Path, seen: set[Path], found: list[Folder], budget: list[int]
) -> None:
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
    if any(e.name == DATASET_INFO and e.is_file() for e in entries):
        found.append(read(real))
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


def read(path: Path) -> Folder:
    from tunedeck.checks.catalog import CatalogError, dataset_info

    try:
        return Folder(path, dataset_info(path))
    except CatalogError as e:
        return Folder(path, {}, problem=str(e))


def where_defined(name: str, settings: Settings) -> list[Path]:
    """The dataset folders that define `name`."""
    return [f.path for f in folders(settings) if name in f.names]


def summary(settings: Settings, *, limit: int = 10) -> str:
    """What exists, in one phrase: "demo_identity, demo_identity_small (in /x/data)" per folder."""
    parts = [
        f"{', '.join(sorted(f.names)[:limit])}{', ...' if len(f.names) > limit else ''} (in {f.path})"
        for f in folders(settings)
        if f.names
    ]
    return "; ".join(parts[:5]) if parts else "none"


COUNT_MAX_BYTES = 64 << 20  # a file larger than this is listed with its size and no row count


def entries(settings: Settings) -> list[dict[str, Any]]:
    """Every dataset of every folder: its file, format, size and row count (None where not counted:
    a hub dataset, a file too large to count, one that cannot be read, saying why)."""
    from tunedeck.checks import reach

    out = []
    for f in folders(settings):
        for name, entry in sorted(f.names.items()):
            entry = entry if isinstance(entry, dict) else {}
            row: dict[str, Any] = {
                "name": name,
                "dataset_dir": str(f.path),
                "formatting": entry.get("formatting", "alpaca"),
                "file": None,
                "size_bytes": None,
                "rows": None,
                "problem": None,
            }
            file_name = entry.get("file_name")
            if not isinstance(file_name, str) or not file_name or "\0" in file_name:
                row["problem"] = "no local file (a hub dataset, or no file_name)"
            elif (path := reach.confine(str(f.path / file_name), settings)) is None:
                row["problem"] = f"{file_name!r} is outside the allowed roots"
            else:
                row["file"] = str(path)
                row.update(_measure(path))
            out.append(row)
    return out


def _measure(path: Path) -> dict[str, Any]:
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        size = sum(p.stat().st_size for p in files)
    except OSError as e:
        return {"problem": f"cannot read it: {e.strerror or e}"}
    if size > COUNT_MAX_BYTES or len(files) != 1 or files[0].suffix not in (".json", ".jsonl"):
        return {"size_bytes": size}
    try:
        if files[0].suffix == ".jsonl":
            with files[0].open("rb") as fh:
                rows = sum(1 for line in fh if line.strip())
        else:
            import json

            data = json.loads(files[0].read_bytes())
            rows = len(data) if isinstance(data, list) else 1
    except (OSError, ValueError) as e:
        return {"size_bytes": size, "problem": f"not valid JSON: {e}"}
    return {"size_bytes": size, "rows": rows}

"""A dataset folder as LLaMA-Factory reads one: a dataset_info.json entry and its data file beside it.

A submit refuses a dataset its dataset_dir does not define (LF014, LF015), so a test whose spec names
a dataset, and probes something else, puts that dataset in place with `add_dataset` first."""

from __future__ import annotations

import json
from pathlib import Path

ROWS = [
    {"instruction": "Who are you?", "input": "", "output": "I am a model fine-tuned with tunedeck."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
]


def add_dataset(folder: Path, name: str = "d", rows: list[dict] | None = None) -> Path:
    """Define `name` (alpaca rows in `<name>.json`) in `folder`'s dataset_info.json, keeping the
    entries it already has; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    info_path = folder / "dataset_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    (folder / f"{name}.json").write_text(json.dumps(ROWS if rows is None else rows))
    info[name] = {"file_name": f"{name}.json"}
    info_path.write_text(json.dumps(info, indent=2))
    return folder

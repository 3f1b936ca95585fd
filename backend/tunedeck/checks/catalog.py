"""What a job may name and the form offers as choices: the chat templates LLaMA-Factory defines, the
datasets a dataset_dir registers in its dataset_info.json (and their first rows), the template a
model folder needs, and the help text of every key.

The template names are data captured from the installed LLaMA-Factory
(scripts/capture_lf_templates.py); the server never imports it. Dataset folders are read only
inside the allowed roots (reach.confine), and only as much of a file as a preview needs. Its codes,
read from the job's dataset folder at submission:

| code  | sev     | what                                                                        |
|-------|---------|-----------------------------------------------------------------------------|
| LF014 | error   | dataset name not defined in the dataset_dir's dataset_info.json             |
| LF015 | error   | the dataset_dir has no readable dataset_info.json (the run would fail)      |
| LF019 | warning | `tunedeck lint` of a file: no dataset_info.json here (names not checked)    |
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from tunedeck.checks import datasets, hubcache, reach
from tunedeck.checks.findings import Finding, finding
from tunedeck.checks.tables import fitting_templates, lf_table, template_table
from tunedeck.config import Settings

DATASET_INFO = "dataset_info.json"
INFO_MAX_BYTES = 8 << 20  # a dataset_info.json of a few thousand entries is well under this
# A `.json` dataset is one array: parsing it for five rows is bounded by its size, a `.jsonl` is not.
JSON_PREVIEW_MAX_BYTES = 32 << 20
LINE_MAX_BYTES = 1 << 20
ROW_TEXT_MAX = 2000  # characters of one value shown in a preview
DATASET_KEYS = ("dataset", "eval_dataset")
# dataset_dir values that make `dataset` a hub id or a path instead of a dataset_info.json entry.
NOT_A_FOLDER = ("ONLINE", "REMOTE:")


class CatalogError(ValueError):
    """A dataset folder or file that cannot be offered; the message says why, `key` which input."""

    def __init__(self, message: str, key: str = "dataset_dir"):
        super().__init__(message)
        self.key = key


def templates() -> list[str]:
    """The template names LLaMA-Factory's `register_template` defines (it refuses any other)."""
    return template_table()["templates"]


def llamafactory_version() -> str | None:
    """The LLaMA-Factory version the captured tables come from."""
    return template_table()["llamafactory_version"]


def key_help(keys: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """LLaMA-Factory's own help, type, default and choices for the keys asked (all when None)."""
    args = lf_table()["args"]
    names = sorted(args) if keys is None else [k for k in keys if k in args]
    return {
        k: {
            "help": args[k].get("help") or "",
            "type": args[k].get("type"),
            "default": args[k].get("default"),
            "choices": args[k].get("choices"),
        }
        for k in names
    }


def close_names(name: str, known: list[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, known, n=n, cutoff=0.5)


# ---------------------------------------------------------------- dataset folders


def _no_nul(value: str, key: str) -> str:
    if "\0" in value:  # no path holds one; the OS calls would refuse it with a ValueError
        raise CatalogError("a path must not contain a NUL character", key=key)
    return value


def dataset_folder(dataset_dir: str | None, settings: Settings) -> Path:
    """The folder a job's dataset names are looked up in, confined to the allowed roots."""
    value = _no_nul(dataset_dir or str(settings.workspace / "data"), "dataset_dir")  # submission's default
    folder = reach.confine(value, settings)
    if folder is None:
        raise CatalogError(f"{value!r} is outside the allowed roots")
    return folder


def dataset_info(folder: Path) -> dict[str, Any]:
    """The folder's dataset_info.json; CatalogError when it is missing or not a JSON object."""
    path = folder / DATASET_INFO
    try:
        if path.stat().st_size > INFO_MAX_BYTES:
            raise CatalogError(f"{path} is larger than {INFO_MAX_BYTES >> 20} MiB")
        data = json.loads(path.read_text())
    except OSError as e:
        raise CatalogError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise CatalogError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path} must hold a JSON object of dataset names")
    return data


def split_names(value: Any) -> list[str]:
    """Dataset names as LLaMA-Factory splits them (commas, or a YAML list)."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else []
    return [str(v).strip() for v in items if str(v).strip()]


def lint_datasets(config: dict[str, Any], settings: Settings, *, server: bool = True) -> list[Finding]:
    """A dataset name that the dataset_dir's dataset_info.json does not define fails 6-12 s into the
    run ("Undefined dataset X"): found here, at its key, with the known names closest to it.
    `server`: checked where the job will run (a missing dataset_info.json is an error, and the fix
    names the datasets the server has); off for `tunedeck lint` of a file that may run elsewhere."""
    dataset_dir = config.get("dataset_dir")
    names = {k: split_names(config.get(k)) for k in DATASET_KEYS}
    if not any(names.values()) or (isinstance(dataset_dir, str) and dataset_dir.startswith(NOT_A_FOLDER)):
        return []
    if dataset_dir is not None and not isinstance(dataset_dir, str):
        return []  # a type error, which the key lint reports
    try:
        folder = dataset_folder(dataset_dir, settings)
    except CatalogError:
        return []  # outside the roots: the path check refuses it at dataset_dir
    try:
        info = dataset_info(folder)
    except CatalogError as e:
        if not server:
            return [
                finding(
                    code="LF019",
                    severity="warning",
                    path="config.dataset_dir",
                    message=f"dataset names not checked: {e}; LLaMA-Factory fails the run if it cannot read it",
                    fix=f"set `dataset_dir` to the folder holding {DATASET_INFO}",
                )
            ]
        # LLaMA-Factory fails the run ~80 s in ("Cannot open .../dataset_info.json"): refused here, at
        # each name, with what exists and how to add it.
        return [
            finding(
                code="LF015",
                severity="error",
                path=f"config.{key}",
                message=f"dataset {name!r} cannot be found: {e}; the run would fail with 'Cannot open "
                f"{folder / DATASET_INFO}'. Datasets this server has: {datasets.summary(settings)}",
                fix=_how_to_add(name, folder, settings),
            )
            for key, wanted in names.items()
            for name in wanted
        ]
    known = sorted(info)
    out = []
    for key, wanted in names.items():
        for name in wanted:
            if name in info:
                continue
            near = close_names(name, known)
            listed = ", ".join(near or known[:10]) or "none"
            if known and (near or not server):
                fix = f"use one of: {listed}"
            else:  # nothing like it here: where it is defined, or how to add it
                fix = _how_to_add(name, folder, settings) if server else f"add {name!r} to {DATASET_INFO}"
            out.append(
                finding(
                    code="LF014",
                    severity="error",
                    path=f"config.{key}",
                    message=f"dataset {name!r} is not defined in {DATASET_INFO} of the dataset_dir "
                    f"({'closest' if near else 'it defines'}: {listed}); "
                    f"the run would fail with 'Undefined dataset {name}'",
                    fix=fix,
                )
            )
    return out


def _how_to_add(name: str, folder: Path, settings: Settings) -> str:
    """The fix for a name the dataset_dir lacks: the folders that define it, or how to add it."""
    if elsewhere := [p for p in datasets.where_defined(name, settings) if p != folder]:
        return f"set `dataset_dir: {elsewhere[0]}` (its {DATASET_INFO} defines {name!r})"
    return (
        f"register it: `tunedeck datasets add {name} FILE` (JSON, JSONL, CSV or Parquet; the format is "
        "detected), POST /api/datasets, or the form's 'add a dataset…'; or "
        f"add {name!r} to {folder / DATASET_INFO} with the data file beside it, e.g. "
        f'{{"{name}": {{"file_name": "{name}.json"}}}} for a JSON list of '
        '{"instruction", "input", "output"} rows (alpaca; sharegpt: add "formatting": "sharegpt" and '
        '"columns": {"messages": "conversations"}), or point `dataset_dir` at a folder that has it'
    )


def _open_data_file(folder: Path, entry: dict[str, Any], settings: Settings) -> Path:
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name:
        where = next((k for k in ("hf_hub_url", "ms_hub_url", "om_hub_url") if k in entry), None)
        raise CatalogError(f"no local file to preview (it loads from {where})" if where else "no file_name")
    path = reach.confine(str(folder / _no_nul(file_name, "dataset_dir")), settings)
    if path is None:
        raise CatalogError(f"{file_name!r} is outside the allowed roots")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl"))
        if not files:
            raise CatalogError(f"{file_name!r} holds no .json or .jsonl file to preview")
        path = files[0]
    if path.suffix not in (".json", ".jsonl"):
        raise CatalogError(f"only .json and .jsonl files are previewed, not {path.suffix or path.name}")
    return path


def _shown(row: Any) -> Any:
    if isinstance(row, dict):
        return {str(k): _shown(v) for k, v in row.items()}
    if isinstance(row, list):
        return [_shown(v) for v in row[:20]]
    if isinstance(row, str) and len(row) > ROW_TEXT_MAX:
        return row[:ROW_TEXT_MAX] + "…"
    return row


def preview(dataset_dir: str | None, name: str, settings: Settings, *, rows: int) -> dict[str, Any]:
    """The first `rows` rows of a dataset registered in dataset_dir, with its dataset_info entry."""
    folder = dataset_folder(dataset_dir, settings)
    info = dataset_info(folder)
    if name not in info:
        near = close_names(name, sorted(info))
        raise CatalogError(
            f"dataset {name!r} is not in {DATASET_INFO}" + (f" (closest: {', '.join(near)})" if near else ""),
            key="name",
        )
    entry = info[name] if isinstance(info[name], dict) else {}
    path = _open_data_file(folder, entry, settings)
    try:
        if path.suffix == ".jsonl":
            out: list[Any] = []
            with path.open("rb") as f:
                while len(out) < rows and (line := f.readline(LINE_MAX_BYTES)):
                    if line.strip():
                        out.append(json.loads(line))
        else:
            if path.stat().st_size > JSON_PREVIEW_MAX_BYTES:
                raise CatalogError(
                    f"{path.name} is larger than {JSON_PREVIEW_MAX_BYTES >> 20} MiB to preview"
                )
            data = json.loads(path.read_text())
            out = data[:rows] if isinstance(data, list) else [data]
    except OSError as e:
        raise CatalogError(f"cannot read {path.name}: {e.strerror or e}") from None
    except ValueError as e:
        raise CatalogError(f"{path.name} is not valid JSON: {e}") from None
    return {
        "name": name,
        "file": str(path),
        "formatting": entry.get("formatting", "alpaca"),
        "columns": entry.get("columns") if isinstance(entry.get("columns"), dict) else None,
        "rows": [_shown(r) for r in out],
    }


def confined(value: str, settings: Settings) -> Path | None:
    """A user's path resolved (links followed) inside the allowed roots; None outside them."""
    return reach.confine(_no_nul(value, "path"), settings)


def model_folder(model: str, settings: Settings) -> Path:
    """A model folder inside the roots, or a cached hub id's snapshot; CatalogError at `model` otherwise."""
    _no_nul(model, "model")
    folder = reach.confine(model, settings) if reach.is_pathlike(model, settings) else None
    if folder is None and reach.HUB_ID.fullmatch(model):
        folder = hubcache.snapshot(model)
    if folder is None:
        raise CatalogError(
            f"{model!r} is neither a folder inside the allowed roots nor in the HF cache", key="model"
        )
    return folder


def model_templates(model: str, settings: Settings) -> dict[str, Any]:
    """The templates a model folder (inside the roots) or a cached hub id needs, from its config.json."""
    folder = model_folder(model, settings)
    try:
        if (folder / "config.json").stat().st_size > reach.CONFIG_JSON_MAX:
            raise CatalogError(f"{folder / 'config.json'} is too large to be a model config")
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CatalogError(f"no readable config.json in {folder}: {e}") from None
    if not isinstance(config, dict):
        raise CatalogError(f"{folder / 'config.json'} is not a JSON object")
    return {
        "model_type": config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        "templates": fitting_templates(config),
    }

"""A dataset's first rows as the model will see them: LLaMA-Factory's converter and chat template
applied with the model's own tokenizer, and each row's token count against cutoff_len.

The tokenizer is transformers', which the server never imports: the trainer's python renders the
rows (tunedeck_train/dataset_probe.py). Answers are kept per (file, its size and mtime, model,
template, cutoff_len, rows), so a page asking again costs no second start of the training stack.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tunedeck.checks import catalog, datasets
from tunedeck.checks.tables import fitting_templates
from tunedeck.config import Settings
from tunedeck.problems import SpecError, detail
from tunedeck.services.assets.formats import SUFFIXES, FormatError
from tunedeck.services.assets.register import probe
from tunedeck.services.errors import NotFound

KEPT = 64  # answers kept
_kept: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
_lock = threading.Lock()


def _bad(key: str, msg: str) -> SpecError:
    return SpecError([detail(["query", key], msg)])


def model_folder(model: str, settings: Settings) -> Path:
    """A model folder inside the roots, or a hub id's copy in the HF cache; 422 at `model` otherwise."""
    try:
        folder = catalog.model_folder(model, settings)
        if not (folder / "config.json").is_file():
            raise _bad("model", f"{folder} holds no config.json")
    except catalog.CatalogError as e:
        raise _bad("model", str(e)) from None
    except OSError as e:  # a name too long for the OS
        raise _bad("model", f"cannot be read: {e.strerror or e}") from None
    return folder


def _entry(name: str, dataset_dir: str | None, settings: Settings) -> tuple[Path, dict[str, Any]]:
    if dataset_dir is not None:
        try:
            folder = catalog.dataset_folder(dataset_dir, settings)
            info = catalog.dataset_info(folder)
        except catalog.CatalogError as e:
            raise _bad("dataset_dir", str(e)) from None
        found = [(folder, info)] if name in info else []
    else:
        found = [(f.path, f.names) for f in datasets.folders(settings) if name in f.names]
    if not found:
        raise NotFound(f"no dataset {name!r} (GET /api/datasets lists them)")
    folder, info = found[0]
    entry = info[name] if isinstance(info[name], dict) else {}
    return folder, entry


def _file(folder: Path, entry: dict[str, Any], settings: Settings) -> Path:
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name or "\0" in file_name:
        raise _bad("name", "the dataset has no local file to preview (a hub dataset?)")
    path = catalog.confined(str(folder / file_name), settings)
    if path is None:
        raise _bad("name", f"its file {file_name!r} is outside the allowed roots")
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
            if not files:
                raise _bad("name", f"{file_name!r} holds no data file to preview")
            path = files[0]
        if not path.is_file() or path.suffix.lower() not in SUFFIXES:
            raise _bad("name", f"{path.name} is not a file tunedeck previews ({', '.join(SUFFIXES)})")
    except OSError as e:
        raise _bad("name", f"its file cannot be read: {e.strerror or e}") from None
    return path


def template_for(folder: Path, template: str | None) -> str:
    if template is not None:
        if template not in catalog.templates():
            near = catalog.close_names(template, catalog.templates())
            raise _bad(
                "template",
                f"LLaMA-Factory has no template {template!r}"
                + (f" (closest: {', '.join(near)})" if near else ""),
            )
        return template
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise _bad("model", f"cannot read {folder / 'config.json'}: {e}") from None
    fitting = fitting_templates(config)
    if not fitting:
        raise _bad("template", "the model's config names no family with a known template: give `template`")
    return fitting[0]


def preview(
    *,
    name: str,
    model: str,
    template: str | None,
    cutoff_len: int,
    rows: int,
    dataset_dir: str | None,
    settings: Settings,
) -> dict[str, Any]:
    """The first `rows` rows of `name`, rendered with the template for the model's tokenizer."""
    folder, entry = _entry(name, dataset_dir, settings)
    path = _file(folder, entry, settings)
    model_dir = model_folder(model, settings)
    chosen = template_for(model_dir, template)
    try:
        stat = path.stat()
    except OSError as e:
        raise _bad("name", f"its file cannot be read: {e.strerror or e}") from None
    key = (
        str(path),
        stat.st_size,
        stat.st_mtime_ns,
        str(model_dir),
        chosen,
        cutoff_len,
        rows,
        json.dumps(entry, sort_keys=True),
    )
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    request = {
        "op": "preview",
        "file": str(path),
        "entry": entry,
        "model": str(model_dir),
        "template": chosen,
        "cutoff_len": cutoff_len,
        "rows": rows,
    }
    try:
        answer = probe(request, settings)
    except FormatError as e:
        raise _bad("name", f"cannot render {path.name} with {model_dir.name}: {e}") from None
    out = {
        "name": name,
        "file": str(path),
        "model": str(model_dir),
        "template": chosen,
        "cutoff_len": cutoff_len,
        "formatting": entry.get("formatting", "alpaca"),
        "rows": answer["rows"],
    }
    with _lock:
        _kept[key] = out
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return out

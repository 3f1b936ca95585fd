"""Registering a dataset: an uploaded file, or a file already inside the allowed roots, checked row by
row (formats.py), added to a dataset folder's dataset_info.json as LLaMA-Factory reads it.

The entry is written atomically (a temporary file beside it, then a rename), with every other entry
kept as it was; one lock per process and an exclusive lock file on the folder keep two registrations
from losing each other's entry. An uploaded file lands in the folder under the dataset's name.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tunedeck import procs
from tunedeck.checks import catalog
from tunedeck.config import Settings
from tunedeck.problems import SpecError, detail
from tunedeck.services.assets.formats import Detected, FormatError, detect, kind_of, read_rows
from tunedeck.services.errors import Conflict

# A name LLaMA-Factory can take in `dataset:` (it splits on commas) and a file can be named after.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
PROBE = procs.script("tunedeck_train.dataset_probe")
MARK = "@@DATASET@@"
PROBE_TIMEOUT_S = 300.0
FILE_MODE = 0o644  # what a data file and a new dataset_info.json get (mkstemp's 0600 otherwise)
_lock = threading.Lock()


class TooLarge(Exception):
    """A file over TUNEDECK_DATASET_MAX_BYTES (413)."""


def _bad(field: str, msg: str) -> SpecError:
    return SpecError([detail(["body", field], msg)])


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise _bad("name", "1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if name.lower().startswith("dataset_info"):  # its file would be dataset_info.json itself
        raise _bad("name", f"{name!r} is the name of LLaMA-Factory's own file: choose another")
    return name


def folder_for(dataset_dir: str | None, settings: Settings) -> Path:
    """The dataset folder an entry goes into (the workspace's data/ by default), confined."""
    try:
        folder = catalog.dataset_folder(dataset_dir, settings)
    except catalog.CatalogError as e:
        raise _bad("dataset_dir", str(e)) from None
    if folder == settings.runs_dir.resolve() or folder.is_relative_to(settings.runs_dir.resolve()):
        raise _bad("dataset_dir", "the run folders are tunedeck's own: choose another folder")
    try:
        if folder.exists() and not folder.is_dir():
            raise _bad("dataset_dir", f"{folder} is not a folder")
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a name too long for the OS, a file in the way, no permission
        raise _bad("dataset_dir", f"cannot be used: {e.strerror or e}") from None
    return folder


def probe(request: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Ask the trainer's python (dataset_probe.py); FormatError with its reason when it cannot."""
    try:
        out = subprocess.run(
            [str(settings.train_python), str(PROBE)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            env={**procs.trainer_env(dict(os.environ)), "HF_HUB_OFFLINE": "1"},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FormatError(f"the training python {settings.train_python} could not read it: {e}") from None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(MARK):
            answer = json.loads(line[len(MARK) :])
            if "error" in answer:
                raise FormatError(answer["error"])
            return answer
    tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
    raise FormatError(f"the training python failed (exit {out.returncode}): {tail}")


def examine(path: Path, settings: Settings) -> Detected:
    """The format of a file, every row checked (Parquet's rows read by the trainer's python)."""
    kind = kind_of(path.name)
    if kind == "parquet":
        rows = probe({"op": "rows", "file": str(path), "limit": 1 << 40}, settings)["rows"]
    else:
        rows = read_rows(path, kind)
    return detect(rows)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with _lock, open(folder / ".dataset_info.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _write_info(folder: Path, info: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dataset_info.", suffix=".tmp")
    try:
        try:  # mkstemp makes it 0600: the file keeps the mode it had
            mode = (folder / catalog.DATASET_INFO).stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = FILE_MODE
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            json.dump(info, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / catalog.DATASET_INFO)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _current(folder: Path) -> dict[str, Any]:
    if not (folder / catalog.DATASET_INFO).exists():
        return {}
    try:
        return catalog.dataset_info(folder)
    except catalog.CatalogError as e:  # never overwrite a file a person may have to repair
        raise _bad("dataset_dir", f"{e}: fix it before adding to it") from None


def _taken(name: str, folder: Path) -> None:
    if name in _current(folder):
        raise Conflict(f"dataset {name!r} is already defined in {folder / catalog.DATASET_INFO}")


def add_upload(
    *, name: str, filename: str, data: IO[bytes], dataset_dir: str | None, settings: Settings
) -> dict[str, Any]:
    """Store an uploaded file as `<folder>/<name><suffix>` and define `name` for it."""
    check_name(name)
    try:
        kind_of(filename or "")
    except FormatError as e:
        raise _bad("file", str(e)) from None
    suffix = Path(filename).suffix.lower()
    folder = folder_for(dataset_dir, settings)
    target = folder / f"{name}{suffix}"
    _taken(name, folder)
    if target.exists():
        raise Conflict(f"{target} already exists")
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=suffix)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            copied = 0
            while chunk := data.read(1 << 20):
                copied += len(chunk)
                if copied > settings.dataset_max_bytes:
                    raise TooLarge(
                        f"the file is larger than TUNEDECK_DATASET_MAX_BYTES ({settings.dataset_max_bytes})"
                    )
                out.write(chunk)
        try:
            found = examine(tmp, settings)
        except FormatError as e:
            raise _bad("file", f"{filename}: {e}") from None
        with _locked(folder):
            info = _current(folder)
            if name in info:
                raise Conflict(f"dataset {name!r} is already defined in {folder / catalog.DATASET_INFO}")
            try:
                os.link(tmp, target)  # fails rather than replacing a file that appeared meanwhile
            except FileExistsError:
                raise Conflict(f"{target} already exists") from None
            info[name] = found.entry(target.name)
            try:
                _write_info(folder, info)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
    finally:
        tmp.unlink(missing_ok=True)
    return _answer(name, folder, target, found, copied)


def add_path(*, name: str, path: str, dataset_dir: str | None, settings: Settings) -> dict[str, Any]:
    """Define `name` for a file already inside the allowed roots (left where it is)."""
    check_name(name)
    try:
        real = catalog.confined(path, settings)  # resolved: a link that leads out is outside too
    except catalog.CatalogError as e:
        raise _bad("path", str(e)) from None
    if real is None:
        raise _bad("path", f"{path!r} is outside the allowed roots")
    try:
        if not real.is_file():
            raise _bad("path", f"{real} is not a file")
        size = real.stat().st_size
    except OSError as e:
        raise _bad("path", f"cannot be read: {e.strerror or e}") from None
    try:
        kind_of(real.name)
    except FormatError as e:
        raise _bad("path", str(e)) from None
    if size > settings.dataset_max_bytes:
        raise TooLarge(f"{real} is larger than TUNEDECK_DATASET_MAX_BYTES ({settings.dataset_max_bytes})")
    folder = folder_for(dataset_dir, settings)
    _taken(name, folder)
    try:
        found = examine(real, settings)
    except FormatError as e:
        raise _bad("path", f"{real.name}: {e}") from None
    with _locked(folder):
        info = _current(folder)
        if name in info:
            raise Conflict(f"dataset {name!r} is already defined in {folder / catalog.DATASET_INFO}")
        info[name] = found.entry(file_name(folder, real))
        _write_info(folder, info)
    return _answer(name, folder, real, found, size)


def _answer(name: str, folder: Path, file: Path, found: Detected, size: int) -> dict[str, Any]:
    return {
        "name": name,
        "dataset_dir": str(folder),
        "file": str(file),
        "size_bytes": size,
        "rows": found.rows,
        "formatting": found.formatting,
        "columns": found.columns,
        "tags": found.tags,
        "detected": found.says(),
        "entry": found.entry(file_name(folder, file)),
    }


def file_name(folder: Path, file: Path) -> str:
    """LLaMA-Factory joins file_name onto dataset_dir: a file inside the folder is named relatively."""
    return str(file.relative_to(folder)) if file.is_relative_to(folder) else str(file)

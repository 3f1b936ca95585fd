"""Where a job's trainer writes: every key it writes to lands in the job's own run folder.

The run folder (`<workspace>/runs/<id>-<name>/`) is named by the job's id, which exists only once the
job is stored, after the checks: a write key is therefore checked here as a path *relative to* the
run folder (the trainer's working folder, where LLaMA-Factory would put a relative path anyway) and
placed there when the spec is rendered into it. An absolute path is accepted only inside
`TUNEDECK_SCRATCH_ROOT` (large temporary files: DeepSpeed's NVMe swap), and lands in the job's own
folder there, `<scratch_root>/<id>-<name>/...`, so two jobs never share one. Nothing else is
writable: not the workspace (its database, the admin token), not another job's run folder. Inside
its own run folder a job may not write tunedeck's files (runner.json, outbox.jsonl, ...) nor into
`output/` itself or its `checkpoint-N` folders: what the trainer saves there is what later jobs load
as tunedeck's own (pickles.py), so nothing else may land there.

Whether a key is written is read from the captured tables' help text ("save", "store", "written",
"offload", "log directory"); a key that is found by its name alone and has no help (DeepSpeed's
constant-only sections, a path-named key at any depth of a DeepSpeed config or a dict-valued
argument) is taken as written: a check that cannot tell fails closed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePath
from typing import Any

from tunedeck.checks.pickles import PICKLE_SUFFIXES
from tunedeck.checks.tables import ds_table
from tunedeck.config import Settings
from tunedeck.contract import runfiles

WRITE_HELP = re.compile(r"\b(save|store|writes?|written|offload\w*|log directory|output)\b", re.IGNORECASE)
# "Path to save or load the tokenized datasets": written when the folder is absent or empty (that is
# LLaMA-Factory's has_tokenized_data), read when it holds something.
LOAD_HELP = re.compile(r"\bload\b", re.IGNORECASE)
# DeepSpeed's monitors: "job_name ... will become a new directory inside `output_path`".
INSIDE_HELP = re.compile(r"directory inside `(\w+)`")
# The runner's and the server's files in a run folder (runfiles.py): never a trainer's to write.
KEPT = (
    runfiles.TRAIN_YAML,
    runfiles.DS_CONFIG,
    runfiles.RUNNER_CONFIG,
    runfiles.RUNNER_LOG,
    runfiles.TRAIN_LOG,
    runfiles.TRAINER_PID,
    runfiles.OUTBOX,
    runfiles.RESULT,
    runfiles.PLACEMENT,
    runfiles.MEMORY_CSV,
)
KEPT_IN_OUTPUT = (runfiles.TRAINER_LOG, runfiles.EXTRA_LOG)
RUN_FOLDER = "<run folder>"  # how a message names the run folder before the job has an id


def is_write(help_text: str | None) -> bool:
    """A path key the trainer writes to, by its help; one with no help text is taken as written."""
    return not help_text or bool(WRITE_HELP.search(help_text))


def when_absent(help_text: str) -> bool:
    """A write key that reads instead while its folder holds something ("save or load")."""
    return bool(LOAD_HELP.search(help_text))


@lru_cache
def ds_helps() -> dict[tuple[str, ...], str]:
    """Help text of each captured DeepSpeed key, by its place in the config."""
    table = ds_table()
    out = {}
    for model, fields in table["models"].items():
        where = tuple(table.get("locations", {}).get(model, model).split("."))
        out.update({(*where, k): info.get("help") or "" for k, info in fields.items()})
    return out


@lru_cache
def ds_subfolder_keys() -> dict[tuple[str, ...], str]:
    """DeepSpeed keys that name a folder made inside another key's path → that key's name."""
    out = {}
    for loc, help_text in ds_helps().items():
        if m := INSIDE_HELP.search(help_text):
            out[loc] = m.group(1)
    return out


@dataclass(frozen=True)
class Placed:
    """A path the trainer writes, placed once the job's run folder is known."""

    loc: tuple[Any, ...]  # ("config", key) or ("deepspeed", section, ..., key)
    rel: str  # relative to the run folder, or to the job's folder under `scratch`
    scratch: Path | None = None  # the scratch root (resolved), or None: the run folder

    def path(self, run_dir: Path) -> Path:
        base = run_dir if self.scratch is None else self.scratch / run_dir.name
        return base / self.rel if self.rel else base

    def shown(self) -> str:
        return str(self.path(Path(RUN_FOLDER)))


def _parts(value: str) -> tuple[str, ...]:
    return tuple(p for p in PurePath(value).parts if p not in ("", "."))


def relative_problem(value: str) -> str | None:
    """Why a path relative to the run folder may not be written, or None."""
    parts = _parts(value)
    if ".." in parts:
        return "must not climb out of the job's run folder (`..`)"
    if not parts:
        return None
    first = parts[0]
    if len(parts) == 1 and any(_is_kept(first, name) for name in KEPT):
        return f"{first!r} is a file tunedeck keeps in the run folder"
    if first == runfiles.OUTPUT:
        if len(parts) == 1:
            return "is the trainer's output folder itself; name a folder inside it"
        if runfiles.CHECKPOINT.match(parts[1]):
            return (
                f"lands in {parts[1]}, which the trainer saves and later jobs load as tunedeck's own "
                "(resume, adapters); name another folder"
            )
        if len(parts) == 2 and parts[1] in KEPT_IN_OUTPUT:
            return f"{parts[1]!r} is the trainer's log that tunedeck reads"
        if len(parts) == 2 and parts[1].endswith(PICKLE_SUFFIXES):
            return (
                f"{parts[1]!r} would sit beside the weights the trainer saves, which later jobs load as "
                "tunedeck's own; name another file"
            )
    return None


def _is_kept(name: str, kept: str) -> bool:
    """`name` is `kept` or a rank's copy of it (runner.rank1.json, runfiles.ranked)."""
    stem, dot, suffix = kept.rpartition(".")
    if not dot:
        return re.fullmatch(re.escape(kept) + r"(\.rank\d+)?", name) is not None
    return re.fullmatch(rf"{re.escape(stem)}(\.rank\d+)?\.{re.escape(suffix)}", name) is not None


def place(value: str, loc: tuple[Any, ...], settings: Settings) -> Placed | str:
    """A write key's value placed in the run folder (relative) or the job's scratch folder (absolute,
    inside the scratch root); else why not, for a 422 at the key."""
    if value.startswith("~"):  # a home folder (on whichever host the trainer runs): no job's own
        return "names a home folder (`~`), which is not the job's: give a path relative to its run folder"
    if not Path(value).is_absolute():
        why = relative_problem(value)
        return why if why else Placed(loc, "/".join(_parts(value)))
    scratch = settings.scratch_root.resolve() if settings.scratch_root is not None else None
    resolved = Path(value).resolve()
    if scratch is not None and (resolved == scratch or resolved.is_relative_to(scratch)):
        return Placed(loc, "" if resolved == scratch else str(resolved.relative_to(scratch)), scratch)
    where = (
        f"or an absolute one inside TUNEDECK_SCRATCH_ROOT ({scratch})"
        if scratch is not None
        else "(TUNEDECK_SCRATCH_ROOT, for large temporary files, is not set)"
    )
    return (
        f"the trainer writes to it, and a job may write only in its own folders: give a path relative to "
        f"its run folder (<workspace>/runs/<id>-<name>/, e.g. {Path(value).name or 'out'!r}) {where}"
    )


def own_scratch(scratch: Path, run_dir: Path) -> None:
    """Make the job's folder under the scratch root, refusing one that a symlink leads elsewhere."""
    folder = scratch / run_dir.name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.is_symlink() or folder.resolve() != scratch.resolve() / run_dir.name:
        raise OSError(f"{folder} is not a folder of the scratch root (a symlink?): not writing there")

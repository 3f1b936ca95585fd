"""Keys whose loader unpickles: a pickle is code, so only tunedeck's own runs' files are loaded.

`torch.load` is an unpickler. In the code `llamafactory-cli train` runs (read in the installed
packages): DeepSpeed loads a checkpoint's model and optimizer states with `weights_only=False`
(runtime/checkpoint_engine/torch_checkpoint_engine.py, runtime/zero/stage3.py), which runs any
Python the file names; the Trainer loads optimizer.pt, scheduler.pt and rng_state.pth, and
transformers, PEFT and LLaMA-Factory's value head load a `.bin` weights file when no safetensors file
is beside it, with `weights_only=True`: a restricted unpickler, which has had bypasses (transformers
refuses it below torch 2.6 for that reason). No numpy `allow_pickle` is on that path.

So, like remote code: a checkpoint key (help: "checkpoint") is accepted for a `checkpoint-N` folder
of a tunedeck run (what the checkpoints listing and resume name) or a folder holding no pickle, a
weights key (help: weights, adapters, "path to the ... model") for such a run's output folder or
checkpoint, or for a folder whose weights are safetensors; anything else is refused at the key
unless TUNEDECK_ALLOW_PICKLES is set. A run folder holds only what tunedeck and its trainer wrote
there: writes.py keeps every write key out of `output/` itself, its `checkpoint-N` folders and its
pickle-named files.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from tunedeck.checks.tables import lf_table
from tunedeck.config import Settings
from tunedeck.contract import runfiles

Loads = Literal["checkpoint", "weights"]
CHECKPOINT_HELP = re.compile(r"\bcheckpoint\b", re.IGNORECASE)
WEIGHTS_HELP = re.compile(r"\bweights?\b|\badapters?\b|\bpath to the (\w+ )?model\b", re.IGNORECASE)
# What torch.save writes, by the names the Trainer (optimizer.pt, rng_state.pth, training_args.bin),
# DeepSpeed (*_model_states.pt, *_optim_states.pt) and pickle itself give it.
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle")
INDEX = ".index.json"
DEEPSPEED_TAG = "latest"  # deepspeed/runtime/engine.py load_checkpoint: reads the tag to load from it
SCAN_MAX = 20000  # files looked at in one checkpoint folder (reach.CODE_SCAN_MAX's bound)


def loads(help_text: str) -> Loads | None:
    """What a read path key's loader unpickles, by its help text."""
    if CHECKPOINT_HELP.search(help_text):
        return "checkpoint"
    if WEIGHTS_HELP.search(help_text):
        return "weights"
    return None


@lru_cache
def weight_pairs() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each pickled weights name with the safetensors names that its loader takes instead (the file
    and its sharded index: transformers prefers either safetensors form to either pickled one)."""
    out = []
    for pair in lf_table().get("weights", []):
        safe = pair["safe"].removesuffix(INDEX)
        out.append((pair["pickled"], (safe, safe + INDEX)))
    return tuple(out)


def own_run(path: Path, settings: Settings, kind: Loads) -> bool:
    """`path` (symlinks resolved) is what a tunedeck job's trainer saved: a `checkpoint-N` of a run's
    output folder or anything inside one; for weights also the output folder itself."""
    runs = settings.runs_dir.resolve()
    resolved = path.resolve()
    if not resolved.is_relative_to(runs):
        return False
    parts = resolved.relative_to(runs).parts  # (<id>-<name>, output, checkpoint-N, ...)
    if len(parts) < 2 or parts[1] != runfiles.OUTPUT:
        return False
    if len(parts) == 2:
        return kind == "weights"
    return runfiles.CHECKPOINT.match(parts[2]) is not None


def pickled_weights(folder: Path) -> str | None:
    """The pickled weights file a loader would read from this folder (no safetensors beside it)."""
    for pickled, safe in weight_pairs():
        if (folder / pickled).is_file() and not any((folder / s).is_file() for s in safe):
            return pickled
    return None


def first_pickle(folder: Path, *, max_files: int = SCAN_MAX) -> str | None:
    """What in the folder torch.load would read (the first pickle file found), or None. Without one,
    DeepSpeed's `latest` still counts: engine.load_checkpoint joins the tag it holds onto the folder
    and loads the states there, so it may lead anywhere."""
    if folder.is_file():
        return folder.name if folder.name.endswith(PICKLE_SUFFIXES) else None
    seen, tag = 0, None
    try:
        for root, dirs, names in os.walk(folder):
            for f in sorted(names):
                if f.endswith(PICKLE_SUFFIXES):
                    return str((Path(root) / f).relative_to(folder))
                if f == DEEPSPEED_TAG and tag is None:
                    tag = f"the states its {(Path(root) / f).relative_to(folder)} names"
            seen += len(names) + len(dirs)
            if seen > max_files:
                return f"one of its more than {max_files} files (not all were checked)"
    except OSError as e:
        return f"a file that could not be checked ({e.strerror or e})"
    return tag


def why(folder: Path, settings: Settings, kind: Loads) -> str | None:
    """Why loading from `folder` would unpickle a file that no tunedeck run wrote, or None."""
    if own_run(folder, settings, kind):
        return None
    found: str | None
    if kind == "checkpoint":
        if not folder.exists():
            found = "what it will hold (it does not exist yet, so it cannot be checked)"
        else:
            found = first_pickle(folder)
        if found is None:
            return None
        return (
            f"{folder} is not a checkpoint of a tunedeck run, and resuming from it unpickles {found}: "
            "DeepSpeed loads its states with torch.load(weights_only=False), which runs any Python they "
            "name, the Trainer its optimizer, scheduler and RNG states with torch.load"
        )
    found = pickled_weights(folder) if folder.is_dir() else None
    if found is None:
        return None
    return (
        f"{folder / found} is loaded with torch.load, an unpickler (no safetensors file beside it), "
        "and no tunedeck run wrote it"
    )

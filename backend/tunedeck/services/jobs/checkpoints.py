"""A run's checkpoints (`checkpoint-N` folders of its output dir): what each holds, which to resume."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from tunedeck.contract import runfiles
from tunedeck.services.errors import Conflict, NotFound
from tunedeck.store.tables import Job

NAME = runfiles.CHECKPOINT
# File name → what it holds; the first match wins, in this order.
PARTS = (
    ("adapter", re.compile(r"^adapter_model\.(safetensors|bin)$")),
    ("model", re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$")),
    ("optimizer", re.compile(r"^optimizer\.(pt|bin)$")),
    ("scheduler", re.compile(r"^scheduler\.pt$")),
    ("rng", re.compile(r"^rng_state(_\d+)?\.pth$")),
    ("trainer_state", re.compile(r"^trainer_state\.json$")),
    ("zero_shards", re.compile(r"^(zero_pp_rank_|bf16_zero_pp_rank_|mp_rank_).*\.pt$")),
)


def _holds(folder: Path) -> tuple[list[str], int, int]:
    """What a checkpoint folder holds, its size in bytes, and its ZeRO shard files."""
    holds: set[str] = set()
    size = shards = 0
    for p in folder.rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        size += p.stat().st_size
        for part, pattern in PARTS:
            if pattern.match(p.name):
                holds.add(part)
                shards += part == "zero_shards"
                break
    return [part for part, _ in PARTS if part in holds], size, shards


def listing(job: Job) -> list[dict]:
    """The job's checkpoints, oldest step first."""
    out = Path(job.output_dir) if job.output_dir else None
    if out is None or not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = NAME.match(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        holds, size, shards = _holds(p)
        found.append(
            {
                "name": p.name,
                "step": int(m.group(1)),
                "mtime": datetime.fromtimestamp(p.stat().st_mtime, timezone.utc),
                "bytes": size,
                "holds": holds,
                "zero_shards": shards,
                # The Trainer resumes from the weights, the optimizer and the scheduler together.
                "resumable": "trainer_state" in holds
                and ("optimizer" in holds or "zero_shards" in holds)
                and ("adapter" in holds or "model" in holds or "zero_shards" in holds),
            }
        )
    return sorted(found, key=lambda c: c["step"])


def choose(job: Job, name: str | None) -> Path:
    """The folder of the named checkpoint, or of the newest resumable one; only inside the job's output."""
    found = listing(job)
    if name is not None:
        match = [c for c in found if c["name"] == name]
        if not match:
            raise NotFound(f"job {job.id} has no {name}")
        chosen = match[0]
        if not chosen["resumable"]:
            raise Conflict(
                f"{name} of job {job.id} holds {', '.join(chosen['holds']) or 'nothing'}: not resumable"
            )
    else:
        usable = [c for c in found if c["resumable"]]
        if not usable:
            raise Conflict(f"job {job.id} has no resumable checkpoint")
        chosen = usable[-1]
    return Path(job.output_dir) / chosen["name"]

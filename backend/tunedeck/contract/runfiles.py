"""A run folder's layout: the file names the server, the executor and the runner agree on.

    <runs_dir>/<id>-<name>/       the job's run_dir
        train.yaml, ds_config.json    rendered at submit
        runner.json, runner.log       the executor's: the runner's configuration and its own output
        train.log, trainer.pid        the runner's: the trainer's raw output, its pid
        outbox.jsonl, result.json     the runner's: every batch it sent, and how the trainer ended
        server.stopped                the server's, while it is stopped: a runner whose trainer ended
                                      leaves its outbox to the next start instead of waiting
        stacks.asked, stacks.json     with runner_transport=files: the server's newest stack-dump
                                      request, and the runner's report for it
        *.rank<r>.*                   the same files of node r's runner in a multi-node job (ranked())
        output/trainer_log.jsonl      LLaMA-Factory's (output_dir), one line per logging step
        output/tunedeck_log.jsonl     tunedeck_train/lf_train.py's: the other numbers of each such line

Both sides import this module, so it imports nothing of either.
"""

from __future__ import annotations

import re
from pathlib import Path

TRAIN_YAML = "train.yaml"
DS_CONFIG = "ds_config.json"
RUNNER_CONFIG = "runner.json"
RUNNER_LOG = "runner.log"
TRAIN_LOG = "train.log"
TRAINER_PID = "trainer.pid"
OUTBOX = "outbox.jsonl"
RESULT = "result.json"
SERVER_STOPPED = "server.stopped"
STACKS_ASKED = "stacks.asked"  # files transport: the newest stack-dump request, a number
STACKS_REPORT = "stacks.json"  # files transport: the runner's report for it (ranked())
OUTPUT = "output"
TRAINER_LOG = "trainer_log.jsonl"  # in the output folder, named by LLaMA-Factory
EXTRA_LOG = "tunedeck_log.jsonl"  # beside it: what trainer_log leaves out (grad_norm...), line for line
PLACEMENT = "placement.json"  # the ray executor's: where each rank of the job runs
BATCH_SCRIPT = "slurm.sh"  # the slurm executor's: the job's batch script, as sbatch ran it
MEMORY_CSV = "memory.csv"  # an imported run's memory samples, kept beside its other files
CHECKPOINT = re.compile(r"^checkpoint-(\d{1,12})$")  # the Trainer's checkpoint-<step> in the output folder


def ranked(name: str, rank: int) -> str:
    """A per-node runner's own file: rank 0 keeps the plain name, rank r gets `.rank<r>` before the
    suffix (runner.rank1.json), so the runners of one job never write each other's files."""
    if not rank:
        return name
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}.rank{rank}.{suffix}" if dot else f"{name}.rank{rank}"


# What a graceful stop leaves in the output root: a LoRA/freeze adapter, or a full model's weights.
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def saved_weights(output: Path) -> str | None:
    """ "adapter" or "model" when the output folder's root holds saved weights, else None."""
    for kind, names in (("adapter", ADAPTER_FILES), ("model", MODEL_FILES)):
        if any((output / n).is_file() for n in names):
            return kind
    return None


def output_dir(run_dir: Path) -> Path:
    """Where the trainer of a run folder writes (LLaMA-Factory's output_dir)."""
    return run_dir / OUTPUT

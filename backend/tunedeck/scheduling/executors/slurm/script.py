"""The batch script of one job, generated from typed, checked values: no text a user typed reaches it
unchecked, and every value is quoted as well (shlex) so even a checked one cannot split a line.

The script is what `sbatch` runs on the job's first node. It asks for `nodes` nodes, one task per
node and the job's GPUs on each as GRES; its one command starts `node.py batch`, which finds the
rendezvous and runs `srun --ntasks-per-node=1` for one runner per node. Paths (the run folder, the
output file) go on sbatch's own command line, not in `#SBATCH` lines, whose parser knows no quotes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tunedeck.config import SLURM_CONSTRAINT, SLURM_NAME, SLURM_TIME

NODE_MODULE = "tunedeck.scheduling.executors.slurm.node"
COMMENT = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


@dataclass(frozen=True)
class BatchJob:
    job_id: int
    nodes: int
    gpus: int
    python: str
    run_dir: str
    comment: str  # marks the server's own jobs in squeue (`tunedeck:<server key>`)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    constraint: str | None = None
    nice: int = 0
    warn_s: int = 0  # seconds before the time limit that Slurm sends every step's tasks SIGUSR1

    def check(self) -> None:
        """ValueError for any value that is not what its field may hold (the spec's models checked
        them already: this holds whatever path they came by)."""
        patterns = {
            "partition": SLURM_NAME,
            "account": SLURM_NAME,
            "qos": SLURM_NAME,
            "time": SLURM_TIME,
            "constraint": SLURM_CONSTRAINT,
        }
        for name, pattern in patterns.items():
            value = getattr(self, name)
            if value is not None and not re.fullmatch(pattern, value):
                raise ValueError(f"slurm.{name} {value!r} is not a Slurm {name}")
        if not COMMENT.fullmatch(self.comment):
            raise ValueError(f"comment {self.comment!r}")
        for name in ("job_id", "nodes", "gpus", "nice", "warn_s"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number, not {getattr(self, name)!r}")
        if self.nodes < 1:
            raise ValueError("nodes must be at least 1")

    def options(self) -> list[str]:
        """The `#SBATCH` options, one per line, each value checked above."""
        out = [
            f"--job-name=tunedeck-{self.job_id}",
            f"--comment={self.comment}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            "--no-requeue",  # a requeued run would need tokens its first start used up
        ]
        if self.gpus:
            out.append(f"--gres=gpu:{self.gpus}")
        for name in ("partition", "account", "qos", "time", "constraint"):
            value = getattr(self, name)
            if value is not None:
                out.append(f"--{name}={value}")
        if self.nice:
            out.append(f"--nice={self.nice}")
        if self.warn_s:  # to the runners (srun's tasks), not the batch shell: they stop and save
            out.append(f"--signal=USR1@{self.warn_s}")
        return out

    def argv(self, script: str, output: str) -> list[str]:
        """sbatch's command line: the paths, then the script (whose lines hold the rest)."""
        return ["sbatch", "--parsable", f"--chdir={self.run_dir}", f"--output={output}", script]

    def render(self) -> str:
        self.check()
        lines = [
            "#!/bin/bash",
            f"# tunedeck job {self.job_id}: written by the server, submitted with sbatch (the run folder",
            "# and the output file are on its command line). One runner per node, started by srun.",
            *(f"#SBATCH {o}" for o in self.options()),
            "set -euo pipefail",
            " ".join(shlex.quote(a) for a in (self.python, "-m", NODE_MODULE, "batch", self.run_dir)),
        ]
        return "\n".join(lines) + "\n"


def nice(priority: int) -> int:
    """tunedeck's priority (0-10, higher first) as Slurm's `--nice` (higher runs later; a user may
    only raise it): priority 10 is nice 0, priority 0 is nice 1000."""
    return max(0, 10 - priority) * 100

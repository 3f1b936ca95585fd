"""What the server tells a job's runner: runner.json, written by the executor, read by the runner.

Both sides import this module, so it imports neither: the runner runs in the training
environment and must not pull in the server's database or routes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tunedeck import runfiles


class RunnerConfig(BaseModel):
    # A field one side spells and the other does not know is an error at once, not a silent default.
    model_config = ConfigDict(extra="forbid")

    job_id: int
    job_key: str = Field(description="marks every process of the job (procs.JOB_KEY_ENV); the run folder")
    server_url: str
    output_dir: str
    train_python: str
    env: dict[str, str] = Field(description="for llamafactory-cli, beyond the runner's own")
    abort_grace_s: float
    term_grace_s: float
    flush_s: float
    batch_max: int
    poll_s: float
    watch: Literal["auto", "poll"] = Field("auto", description="how the runner follows trainer_log.jsonl")
    retry_max_s: float
    give_up_s: float
    memory_sample_s: float = 1.0
    memory_polls: int = 4
    rlimit_as_bytes: int | None = None
    bus_ids: list[str] = Field(
        default_factory=list,
        description="PCI bus ids of the job's devices as the server's SMI library numbers them; the "
        "sampler finds them by bus id (its library may number them otherwise); empty: by index")

    def write(self, run_dir: Path) -> None:
        """runner.json in the run folder, readable by its owner only."""
        fd = os.open(run_dir / runfiles.RUNNER_CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.model_dump_json(indent=2))

    @classmethod
    def read(cls, run_dir: Path) -> RunnerConfig:
        return cls.model_validate_json((run_dir / runfiles.RUNNER_CONFIG).read_text())

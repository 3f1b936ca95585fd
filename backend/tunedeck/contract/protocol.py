"""What the server and a job's runner tell each other: runner.json (written by the executor, read by
the runner) and the telemetry batches the runner sends back.

Both sides import this module, so it imports neither: the runner runs in the training
environment and must not pull in the server's database or routes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic import Field as PField
from pydantic_core import PydanticCustomError

from tunedeck.contract import runfiles


class RunnerConfig(BaseModel):
    # A field one side spells and the other does not know is an error at once, not a silent default.
    model_config = ConfigDict(extra="forbid")

    job_id: int
    job_key: str = Field(description="marks every process of the job (procs.JOB_KEY_ENV); the run folder")
    server_url: str
    output_dir: str
    train_python: str
    command: Literal["train", "export", "api"] = Field("train", description="the llamafactory-cli command")
    env: dict[str, str] = Field(description="for llamafactory-cli, beyond the runner's own")
    abort_grace_s: float
    term_grace_s: float
    flush_s: float
    batch_max: int
    poll_s: float
    watch: Literal["auto", "poll"] = Field("auto", description="how the runner follows trainer_log.jsonl")
    retry_max_s: float
    give_up_s: float
    unreachable_s: float = Field(
        120.0,
        description="after the trainer ended: how long no server answering at all makes the runner leave "
        "its outbox to the server's recovery",
    )
    transport: Literal["http", "files"] = Field(
        "http",
        description="`files`: batches go to the outbox only, stack dumps through the run folder; the server "
        "reads both there (compute nodes that cannot reach it)",
    )
    memory_sample_s: float = 1.0
    memory_polls: int = 4
    rlimit_as_bytes: int | None = None
    node: str = Field(
        "",
        description="the node this runner samples, as its batches name it; empty: the runner's host name",
    )
    bus_ids: list[str] = Field(
        default_factory=list,
        description="PCI bus ids of the job's devices as the server's SMI library numbers them; the "
        "sampler finds them by bus id (its library may number them otherwise); empty: by index",
    )

    rank: int = Field(
        0,
        ge=0,
        description="the node's rank in a multi-node job: rank 0 reports metrics and the end; the others "
        "their output and memory only, from files of their own (runfiles.ranked)",
    )
    watch_parent: bool = Field(
        False,
        description="end the job's processes here and exit when the process that started the runner is "
        "gone (a Ray actor whose node was lost)",
    )

    def write(self, run_dir: Path) -> None:
        """runner.json (runner.rank<r>.json) in the run folder, readable by its owner only."""
        path = run_dir / runfiles.ranked(runfiles.RUNNER_CONFIG, self.rank)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.model_dump_json(indent=2))

    @classmethod
    def read(cls, run_dir: Path, rank: int = 0) -> RunnerConfig:
        return cls.model_validate_json((run_dir / runfiles.ranked(runfiles.RUNNER_CONFIG, rank)).read_text())


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    raw: str = PField(max_length=65536)
    extra: str | None = PField(
        None, max_length=65536, description="the tunedeck_log.jsonl line of the same event (grad_norm, ...)"
    )


class LogIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    stream: str = PField(pattern="^(stdout|stderr|runner)$")
    text: str = PField(max_length=65536)


# What a trainer can be doing, as runners report it (runner/phases.py reads it from the output) and
# the words the pages and the job's log say it in (frontend/js/fmt.js PHASES holds the same words).
PHASES = {
    "waiting_for_ranks": "waiting for the other ranks",
    "loading_model": "loading the model",
    "preparing_dataset": "tokenizing the dataset",
    "building_op": "building a DeepSpeed op",
    "training": "training",
    "evaluating": "evaluating",
    "predicting": "generating predictions",
    "saving": "saving a checkpoint",
    "exporting": "exporting the model",
    "serving": "serving chat requests",
}


class RunnerState(Strict):
    """A runner's report about the training process: it started, it is in a new phase, it exited."""

    event: str = PField(pattern="^(started|phase|exited)$")
    phase: str | None = PField(
        None, pattern=f"^({'|'.join(PHASES)})$", description="with `phase`: the one the trainer entered"
    )
    t: float | None = PField(
        None,
        allow_inf_nan=False,
        description="with `phase`: when it began (the runner's clock, epoch seconds)",
    )

    @model_validator(mode="after")
    def _phase_named(self) -> RunnerState:
        if self.event == "phase" and (self.phase is None or self.t is None):
            raise ValueError("a phase event names its `phase` and when it began (`t`)")
        return self

    trainer_pid: int | None = PField(None, ge=1, le=2**22, description="a Linux pid (at most PID_MAX_LIMIT)")
    exit_code: int | None = PField(None, ge=-(2**31), le=2**31)
    cancelled: bool = False
    time_limit: bool = PField(
        False,
        description="with `exited`: the runner was warned that its allocation ends (SIGUSR1, Slurm's "
        "`--signal`) and stopped the trainer after a step, with a checkpoint",
    )
    cause: str | None = PField(None, max_length=2000)


NODE_PATTERN = r"^[A-Za-z0-9._:\-]*$"  # a host name or an IPv4/IPv6 address


def node_name(name: str) -> str:
    """A host name as batches may carry it (odd characters become '-')."""
    return re.sub(r"[^A-Za-z0-9._:\-]", "-", name)[:253]


class TelemetryBatch(Strict):
    seq: int = PField(ge=0, le=2**62)
    node: str = PField(
        "",
        max_length=253,
        pattern=NODE_PATTERN,
        description="the node whose GPUs its memory samples read (a runner per node); empty: the job's one node",
    )
    metrics: list[MetricIn] = PField([], max_length=20000)
    logs: list[LogIn] = PField([], max_length=20000)
    states: list[RunnerState] = PField([], max_length=10)
    memory: Annotated[list[MemoryIn] | MemoryColumns, WrapValidator(_memory_form)] = PField(
        [],
        description="memory samples: a list of rows, or one array per field (`MemoryColumns`, what runners send)",
    )


class MemoryIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    gpu: int = PField(ge=-1, le=1_000_000)
    used_bytes: int = PField(ge=0, le=2**62)
    total_bytes: int | None = PField(None, ge=0, le=2**62)
    util: float | None = PField(None, allow_inf_nan=False)
    power_w: float | None = PField(None, allow_inf_nan=False)
    temp_c: float | None = PField(None, allow_inf_nan=False, description="edge sensor (none on MI300 parts)")
    temp_junction_c: float | None = PField(None, allow_inf_nan=False)
    temp_hbm_c: float | None = PField(None, allow_inf_nan=False)
    power_shared_with: int | None = PField(
        None, ge=0, le=1_000_000, description="the GPU whose power reading covers this one (MI250X GCDs)"
    )
    ecc_correctable: int | None = PField(None, ge=0, le=2**62)
    ecc_uncorrectable: int | None = PField(None, ge=0, le=2**62)
    throttle_power: float | None = PField(
        None, ge=0, le=1, description="share of the interval power-throttled"
    )
    throttle_thermal: float | None = PField(None, ge=0, le=1)
    throttle_hbm: float | None = PField(None, ge=0, le=1)
    clock_mhz: float | None = PField(None, allow_inf_nan=False)
    xgmi_read_bytes: int | None = PField(
        None, ge=0, le=2**62, description="xGMI bytes read over every link, cumulative (AMD MI300 series)"
    )
    xgmi_write_bytes: int | None = PField(None, ge=0, le=2**62, description="xGMI bytes written, cumulative")
    name: str | None = PField(None, max_length=200)
    serial: str | None = PField(None, max_length=200)
    uuid: str | None = PField(None, max_length=200)
    partition: str | None = PField(None, max_length=200)
    ecc_blocks: str | None = PField(None, max_length=2000)


SAMPLES_MAX = 20000
Count = Annotated[int, PField(ge=0, le=2**62)]
Finite = Annotated[float, PField(allow_inf_nan=False)]
Share = Annotated[float, PField(ge=0, le=1)]


class MemoryColumns(Strict):
    """Memory samples as one array per field, sample i at index i of each: validated per column in
    pydantic's core, with no object per sample, and half the bytes of the row form on the wire."""

    line: list[Count] = PField(max_length=SAMPLES_MAX)
    t: list[Finite] = PField(max_length=SAMPLES_MAX)
    gpu: list[Annotated[int, PField(ge=-1, le=1_000_000)]] = PField(max_length=SAMPLES_MAX)
    used_bytes: list[Count] = PField(max_length=SAMPLES_MAX)
    total_bytes: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    util: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    power_w: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    temp_c: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    temp_junction_c: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    temp_hbm_c: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    power_shared_with: list[Annotated[int, PField(ge=0, le=1_000_000)] | None] | None = PField(
        None, max_length=SAMPLES_MAX
    )
    ecc_correctable: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    ecc_uncorrectable: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    throttle_power: list[Share | None] | None = PField(None, max_length=SAMPLES_MAX)
    throttle_thermal: list[Share | None] | None = PField(None, max_length=SAMPLES_MAX)
    throttle_hbm: list[Share | None] | None = PField(None, max_length=SAMPLES_MAX)
    clock_mhz: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    xgmi_read_bytes: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    xgmi_write_bytes: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    name: list[Annotated[str, PField(max_length=200)] | None] | None = PField(None, max_length=SAMPLES_MAX)
    serial: list[Annotated[str, PField(max_length=200)] | None] | None = PField(None, max_length=SAMPLES_MAX)
    uuid: list[Annotated[str, PField(max_length=200)] | None] | None = PField(None, max_length=SAMPLES_MAX)
    partition: list[Annotated[str, PField(max_length=200)] | None] | None = PField(
        None, max_length=SAMPLES_MAX
    )
    ecc_blocks: list[Annotated[str, PField(max_length=2000)] | None] | None = PField(
        None, max_length=SAMPLES_MAX
    )


_MEMORY_ROWS = TypeAdapter(list[MemoryIn])


def _memory_form(value: Any, _handler: Any) -> list[MemoryIn] | MemoryColumns:
    # Each form validated on its own, so an error names the field as sent (memory.0.util or
    # memory.util.0), not a union branch.
    if not isinstance(value, dict):
        return _MEMORY_ROWS.validate_python(value)
    cols = MemoryColumns.model_validate(value)
    n = len(cols.line)
    short = [(k, len(v)) for k, v in cols if v is not None and len(v) != n]
    if short:
        raise ValidationError.from_exception_data(
            "MemoryColumns",
            [
                {
                    "type": PydanticCustomError(
                        "column_length",
                        "`{field}` has {got} values where `line` has {want}: one per sample",
                        {"field": k, "got": got, "want": n},
                    ),
                    "loc": (k,),
                    "input": got,
                }
                for k, got in short
            ],
        )
    return cols


TelemetryBatch.model_rebuild()

"""Stack dumps of a job's trainer processes (py-spy, taken by each node's runner when the server asks)
and where each rank waits, read from them.

A runner learns of a request from the answer to its telemetry batches (`stacks`: the newest request's
number), dumps every Python process of its job and posts them as one `StackReport`. The summary reads
each rank's main thread from the innermost frame out and names the first thing it recognises: a
collective (torch.distributed's own function names), data loading (torch.utils.data), a checkpoint
save, or the backward or forward pass; the phase it is in (backward, optimizer step) is said beside a
collective. Both sides import this module; it imports neither.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic import Field as PField

from tunedeck.contract.protocol import NODE_PATTERN

MAX_THREADS = 256
# The flight recorder's files in a run folder (tunedeck_train/lf_train.py writes the answers and keeps
# the same names: the trainer imports nothing of tunedeck). The timeout dump is torch's own pickle,
# written at TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank when TORCH_NCCL_DUMP_ON_TIMEOUT is on.
FLIGHT_RECORDER_PREFIX = "flight_recorder_rank_"
FLIGHT_REQUEST = "flight_recorder.request"
FLIGHT_ANSWER = FLIGHT_RECORDER_PREFIX + "{rank}.json"
MAX_FRAMES = 200


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Frame(Strict):
    name: str = PField(max_length=500)
    file: str = PField(max_length=2000)
    line: int = PField(ge=0, le=2**31)


class Thread(Strict):
    name: str | None = PField(None, max_length=500)
    active: bool = False
    frames: list[Frame] = PField(
        [], max_length=MAX_FRAMES, description="innermost first, as py-spy lists them"
    )


class FlightCollective(Strict):
    pg: str = PField(max_length=100, description="the process group's id")
    seq: int = PField(ge=-1, le=2**62, description="collective_seq_id in that group")
    op: str = PField(max_length=200, description="all_reduce, all_gather, ... (the backend's prefix cut)")
    sizes: list[list[int]] = PField([], max_length=16, description="its input tensors' shapes")


class FlightGroup(Strict):
    pg: str = PField(max_length=100)
    last_enqueued: int = PField(ge=-1, le=2**62)
    last_completed: int = PField(ge=-1, le=2**62)


class FlightRecord(Strict):
    """A rank's flight recorder, read by its runner: per group, the last collective it entered and the
    last that completed; the collectives entered and not completed, oldest first."""

    source: str = PField(
        max_length=200, description="'asked' (a live dump) or the file torch wrote on a timeout"
    )
    groups: list[FlightGroup] = PField([], max_length=64)
    pending: list[FlightCollective] = PField([], max_length=32)
    error: str | None = PField(None, max_length=2000)


class ProcessDump(Strict):
    pid: int = PField(ge=1, le=2**22)
    rank: int | None = PField(None, ge=0, le=2**20, description="the process's RANK (torchrun's global rank)")
    command: str = PField("", max_length=2000)
    threads: list[Thread] = PField([], max_length=MAX_THREADS)
    error: str | None = PField(None, max_length=2000, description="why this process could not be dumped")
    flight: FlightRecord | None = PField(None, description="its flight recorder, when the job turned it on")


class StackReport(Strict):
    request: int = PField(ge=1, le=2**31)
    node: str = PField("", max_length=253, pattern=NODE_PATTERN, description="as its batches name it")
    runner_rank: int = PField(0, ge=0, le=2**20, description="the node's rank in a multi-node job")
    processes: list[ProcessDump] = PField([], max_length=512)
    error: str | None = PField(None, max_length=2000, description="why nothing could be dumped on this node")


# torch.distributed's collectives and point-to-point calls, by the names of its own functions
# (torch/distributed/distributed_c10d.py) and DeepSpeed's comm wrappers of them (deepspeed/comm/comm.py).
COLLECTIVES = re.compile(
    r"^(all_reduce|all_reduce_coalesced|all_gather|all_gather_into_tensor|all_gather_object|"
    r"_all_gather_base|reduce_scatter|reduce_scatter_tensor|_reduce_scatter_base|all_to_all|"
    r"all_to_all_single|broadcast|broadcast_object_list|reduce|gather|scatter|barrier|"
    r"monitored_barrier|send|recv|isend|irecv|batch_isend_irecv|wait|init_process_group|"
    r"new_group|_store_based_barrier|rendezvous)$"
)
DISTRIBUTED_FILES = ("torch/distributed/", "deepspeed/comm/")
DATA_FILES = ("torch/utils/data/", "datasets/", "llamafactory/data/")
SAVE = re.compile(r"^(save_pretrained|save_model|_save_checkpoint|_save|save_checkpoint|save_file)$")


def _phase(frames: list[Frame]) -> str | None:
    for f in frames:  # innermost first: the nearest phase
        if f.name == "backward" or f.name == "_engine_run_backward":
            return "backward"
        if f.name in ("step", "_step") and ("optim" in f.file or "deepspeed/runtime" in f.file):
            return "optimizer step"
        if f.name == "forward":
            return "forward"
    return None


def place(frames: list[Frame]) -> str:
    """Where one thread waits, in a few words: 'all_reduce (backward)', 'data loading', ..."""
    for f in frames:
        if COLLECTIVES.match(f.name) and any(d in f.file for d in DISTRIBUTED_FILES):
            phase = _phase(frames)
            return f"{f.name} ({phase})" if phase else f.name
    for f in frames:
        if any(d in f.file for d in DATA_FILES):
            return "data loading"
        if SAVE.match(f.name):
            return "saving a checkpoint"
    phase = _phase(frames)
    if phase:
        return f"the {phase} pass" if phase != "optimizer step" else "the optimizer step"
    if frames:
        f = frames[0]
        return f"{f.name} ({f.file.rsplit('/', 1)[-1]}:{f.line})"
    return "no Python frame"


def main_thread(dump: ProcessDump) -> Thread | None:
    """The thread that trains: MainThread when named, else the one with the deepest stack."""
    named = [t for t in dump.threads if t.name == "MainThread"]
    if named:
        return named[0]
    return max(dump.threads, key=lambda t: len(t.frames), default=None)


def _ranges(ranks: list[int]) -> str:
    out, start, prev = [], None, None
    for r in sorted(ranks) + [None]:
        if start is None:
            start = prev = r
        elif r is not None and prev is not None and r == prev + 1:
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}–{prev}")
            start = prev = r
    return ", ".join(out)


def ranks_places(reports: list[StackReport]) -> list[dict[str, Any]]:
    """Each rank's trainer process (a process with RANK), with where its main thread waits."""
    out = []
    for report in reports:
        for p in report.processes:
            if p.rank is None:
                continue
            thread = main_thread(p) if not p.error else None
            where = place(thread.frames) if thread is not None else f"not dumped: {p.error or 'no thread'}"
            out.append({"rank": p.rank, "node": report.node, "pid": p.pid, "where": where})
    return sorted(out, key=lambda r: r["rank"])


def summary(reports: list[StackReport]) -> str:
    """'ranks 0–2 in all_reduce (backward), rank 3 in data loading'; ranks grouped by place."""
    groups: dict[str, list[int]] = {}
    for r in ranks_places(reports):
        groups.setdefault(r["where"], []).append(r["rank"])
    if not groups:
        return "no rank's trainer process was dumped"
    parts = sorted(groups.items(), key=lambda kv: min(kv[1]))
    return ", ".join(
        f"{'ranks' if len(ranks) > 1 else 'rank'} {_ranges(ranks)} in {where}" for where, ranks in parts
    )


def _flight_phrases(records: dict[int, FlightRecord | None]) -> dict[str, list[int]]:
    """Per rank, what its recorder says of the group where the ranks part: waiting in a collective that
    has not completed, or never having entered the newest one another rank entered."""
    newest: dict[str, int] = {}
    for record in records.values():
        for g in record.groups if record else ():
            newest[g.pg] = max(newest.get(g.pg, -1), g.last_enqueued)
    several = len(newest) > 1
    phrases: dict[str, list[int]] = {}
    for rank, record in records.items():
        if record is None or record.error:
            said = f"no flight record ({record.error})" if record else "no flight record (it did not answer)"
            phrases.setdefault(said, []).append(rank)
            continue
        ops = {(c.pg, c.seq): c.op for c in record.pending}
        said = ""
        for g in sorted(record.groups, key=lambda g: g.pg):
            where = f" of group {g.pg}" if several else ""
            if g.last_completed < g.last_enqueued:
                seq = g.last_completed + 1
                said = f"in {ops.get((g.pg, seq), 'a collective')} #{seq}{where}, not completed"
                break
            if g.last_enqueued < newest[g.pg]:
                said = f"never entered #{g.last_enqueued + 1}{where} (completed #{g.last_completed})"
                break
        phrases.setdefault(said or "all its collectives completed", []).append(rank)
    return phrases


def flight_summary(reports: list[StackReport]) -> str | None:
    """'rank 0 in all_gather #2, not completed; rank 1 never entered #2 (completed #1)', or None when no
    rank's process has a flight record."""
    records = {p.rank: p.flight for r in reports for p in r.processes if p.rank is not None}
    if not any(records.values()):
        return None
    parts = sorted(_flight_phrases(records).items(), key=lambda kv: min(kv[1]))
    return "; ".join(
        f"{'ranks' if len(ranks) > 1 else 'rank'} {_ranges(ranks)} {said}" for said, ranks in parts
    )

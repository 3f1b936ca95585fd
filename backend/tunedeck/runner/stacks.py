"""The runner's side of a stack-dump request: every Python process of the job on this node (the trainer
and its descendants: torchrun's agent, each rank's worker), dumped with py-spy by pid.

py-spy runs with `--nonblocking`: it reads the process's memory without pausing it, so a dump never
stops a rank in a collective, and it still reads a process that is itself stopped (SIGSTOP), where a
blocking dump fails to suspend it. Each dump is bounded in time; a process that cannot be dumped says
why (py-spy missing, no permission to read another process: CAP_SYS_PTRACE in a container).

When the job turned torch's flight recorder on, each rank's record comes too: a live one, asked of the
rank's own answering thread (tunedeck_train/lf_train.py) through a request file in the run folder, and
the dump torch itself wrote on a collective's timeout. That dump is a pickle, and a pickle is code: it is
read only when every opcode in it builds plain data (no global, no call), and by an unpickler that
finds no class.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tunedeck.contract.stacks import (
    FLIGHT_ANSWER,
    FLIGHT_RECORDER_PREFIX,
    FLIGHT_REQUEST,
    MAX_FRAMES,
    MAX_THREADS,
    FlightCollective,
    FlightGroup,
    FlightRecord,
    ProcessDump,
    StackReport,
)

DUMP_TIMEOUT_S = 30.0
DUMP_TRIES = 3  # reads of a process that answered with an error or no thread (see dump_process)
FLIGHT_WAIT_S = 20.0  # for every rank's answering thread to write its record (it looks twice a second)
MAX_FLIGHT_BYTES = 64 * 2**20
# The opcodes of a pickle of dicts, lists, tuples, strings, bytes, numbers, booleans and None (any
# protocol): nothing that names a global, calls one, or sets an object's state.
PLAIN_OPCODES = frozenset(
    "PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 "
    "LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE SHORT_BINUNICODE BINUNICODE "
    "BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE "
    "TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT SETITEM SETITEMS EMPTY_SET ADDITEMS FROZENSET GET BINGET "
    "LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE".split()
)


def py_spy() -> str | None:
    """The py-spy next to this Python (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _python(p: psutil.Process) -> bool:
    try:
        return "python" in Path(p.exe()).name or "python" in Path((p.cmdline() or [""])[0]).name
    except (psutil.Error, OSError):
        return False


def _rank(p: psutil.Process) -> int | None:
    try:
        value = p.environ().get("RANK")
    except (psutil.Error, OSError):
        return None
    return int(value) if value is not None and value.isdigit() else None


def _threads(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in raw[:MAX_THREADS]:
        frames = [
            {
                "name": str(f.get("name", ""))[:500],
                "file": str(f.get("filename", ""))[:2000],
                "line": f.get("line") or 0,
            }
            for f in (t.get("frames") or [])[:MAX_FRAMES]
        ]
        name = t.get("thread_name")
        out.append(
            {"name": str(name)[:500] if name else None, "active": bool(t.get("active")), "frames": frames}
        )
    return out


def dump_process(
    pid: int, spy: str, *, timeout_s: float = DUMP_TIMEOUT_S, tries: int = DUMP_TRIES
) -> dict[str, Any]:
    """One process's threads (innermost frame first), or why not. A read without stopping the process
    can catch its interpreter mid-change (an error, or no thread at all, which a live Python never has):
    it is taken again, up to `tries` times, and the last reason is told."""
    got: dict[str, Any] = {}
    for _ in range(tries):
        got = _dump_once(pid, spy, timeout_s)
        if got.get("threads") or got.get("fatal"):
            break
    got.pop("fatal", None)
    return got


def _dump_once(pid: int, spy: str, timeout_s: float) -> dict[str, Any]:
    try:
        r = subprocess.run(
            [spy, "dump", "--nonblocking", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy did not answer in {timeout_s:.0f} s", "fatal": True}
    except OSError as e:
        return {"error": f"cannot run py-spy: {e}", "fatal": True}
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        return {"error": "py-spy: " + (" / ".join(why[-2:]) if why else f"exit {r.returncode}")[:1900]}
    try:
        threads = _threads(json.loads(r.stdout))
    except (ValueError, AttributeError, TypeError) as e:
        return {"error": f"py-spy printed no stack list: {e}"[:1900]}
    return {"threads": threads} if threads else {"error": "py-spy read no thread of the process"}


def _flight_on(p: psutil.Process) -> bool:
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        return False
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return size.isdigit() and int(size) > 0


def collect(
    root_pid: int | None, *, request: int, node: str, runner_rank: int, folder: Path | None = None
) -> StackReport:
    """Dumps of the trainer process and each Python descendant of it on this node, with each rank's
    flight record when the job has the recorder on (read in `folder`, the run folder)."""
    spy = py_spy()
    if spy is None:
        return StackReport(
            request=request,
            node=node,
            runner_rank=runner_rank,
            error="py-spy is not installed in the runner's environment (pip install py-spy)",
        )
    try:
        root = psutil.Process(root_pid) if root_pid else None
        tree = [root, *root.children(recursive=True)] if root is not None else []
    except psutil.Error:
        tree = []
    if not tree:
        return StackReport(
            request=request, node=node, runner_rank=runner_rank, error="no trainer process runs"
        )
    dumps = []
    ranked: dict[int, psutil.Process] = {}  # a rank's first process: its DataLoader workers share its RANK
    for p in tree:
        if not _python(p):
            continue
        try:
            command = " ".join(p.cmdline())[:2000]
        except psutil.Error:
            command = ""
        got = dump_process(p.pid, spy)
        dumps.append(ProcessDump(pid=p.pid, rank=_rank(p), command=command, **got))
        if dumps[-1].rank is not None:
            ranked.setdefault(dumps[-1].rank, p)
    if folder is not None and any(_flight_on(p) for p in ranked.values()):
        records = flight_records(folder, sorted(ranked), request)
        firsts = {p.pid: rank for rank, p in ranked.items()}
        dumps = [
            d.model_copy(update={"flight": records[firsts[d.pid]]}) if d.pid in firsts else d for d in dumps
        ]
    return StackReport(request=request, node=node, runner_rank=runner_rank, processes=dumps)


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight record names {module}.{name}: refused")


def plain_pickle(data: bytes) -> Any:
    """The data a pickle of plain containers holds; ValueError for any other pickle, before it runs."""
    if len(data) > MAX_FLIGHT_BYTES:
        raise ValueError(f"{len(data)} bytes: at most {MAX_FLIGHT_BYTES}")
    try:
        for op, _, pos in pickletools.genops(data):
            if op.name not in PLAIN_OPCODES:
                raise ValueError(f"opcode {op.name} at byte {pos} builds more than plain data: not read")
        return _NoClasses(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, TypeError) as e:
        raise ValueError(f"not a readable pickle: {e}") from None


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def flight_record(dumps: list[Any], source: str) -> FlightRecord:
    """The groups' positions and the collectives not completed, from torch's dump dicts (its JSON
    and its pickle say the same keys)."""
    groups: dict[str, FlightGroup] = {}
    pending: list[FlightCollective] = []
    errors = []
    for dump in dumps:
        if not isinstance(dump, dict):
            continue
        if dump.get("error"):
            errors.append(str(dump["error"]))
            continue
        for pg, st in (dump.get("pg_status") or {}).items():
            if isinstance(st, dict):
                g = FlightGroup(
                    pg=str(pg)[:100],
                    last_enqueued=max(-1, _int(st.get("last_enqueued_collective"))),
                    last_completed=max(-1, _int(st.get("last_completed_collective"))),
                )
                groups[g.pg] = g
        for e in dump.get("entries") or []:
            if not isinstance(e, dict) or e.get("is_p2p"):
                continue
            pg, seq = str(e.get("pg_id", ""))[:100], max(-1, _int(e.get("collective_seq_id")))
            if pg in groups and seq > groups[pg].last_completed:
                op = str(e.get("profiling_name", "")).split(":", 1)[-1][:200]
                sizes = [
                    [_int(d, 0) for d in shape[:8]]
                    for shape in (e.get("input_sizes") or [])[:16]
                    if isinstance(shape, list)
                ]
                pending.append(FlightCollective(pg=pg, seq=seq, op=op, sizes=sizes))
    pending.sort(key=lambda c: (c.pg, c.seq))
    some = bool(groups) or not errors
    return FlightRecord(
        source=source,
        groups=list(groups.values())[:64],
        pending=pending[:32],
        error=None if some else "; ".join(errors)[:2000],
    )


def flight_records(folder: Path, ranks: list[int], request: int, *, wait_s: float = FLIGHT_WAIT_S) -> dict:
    """Per rank: its live record (asked through the request file), else torch's timeout dump, else
    why none."""
    try:
        (folder / FLIGHT_REQUEST).write_text(str(request))
    except OSError as e:
        return {r: FlightRecord(source="asked", error=f"cannot ask: {e}") for r in ranks}
    out: dict[int, FlightRecord] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for rank in ranks:
            if rank in out:
                continue
            try:
                got = json.loads((folder / FLIGHT_ANSWER.format(rank=rank)).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(got, dict) and _int(got.get("request")) >= request:
                out[rank] = flight_record(got.get("dumps") or [], "asked")
        if len(out) == len(ranks) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for rank in ranks:
        if rank not in out:
            out[rank] = _timeout_dump(folder, rank)
    return out


def _timeout_dump(folder: Path, rank: int) -> FlightRecord:
    path = folder / f"{FLIGHT_RECORDER_PREFIX}{rank}"
    source = f"torch's timeout dump {path.name}"
    try:
        size = path.stat().st_size
        if size > MAX_FLIGHT_BYTES:
            return FlightRecord(source=source, error=f"{size} bytes: at most {MAX_FLIGHT_BYTES} are read")
        data = path.read_bytes()
    except OSError:
        return FlightRecord(source="asked", error="it did not answer: a stopped or lost rank")
    try:
        return flight_record([plain_pickle(data)], source)
    except ValueError as e:
        return FlightRecord(source=source, error=str(e)[:2000])

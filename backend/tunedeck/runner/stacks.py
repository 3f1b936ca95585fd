"""The runner's side of a stack-dump request: every Python process of the job on this node (the trainer
and its descendants: torchrun's agent, each rank's worker), dumped with py-spy by pid.

py-spy runs with `--nonblocking`: it reads the process's memory without pausing it, so a dump never
stops a rank in a collective, and it still reads a process that is itself stopped (SIGSTOP), where a
blocking dump fails to suspend it. Each dump is bounded in time; a process that cannot be dumped says
why (py-spy missing, no permission to read another process: CAP_SYS_PTRACE in a container).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from tunedeck.contract.stacks import MAX_FRAMES, MAX_THREADS, ProcessDump, StackReport

DUMP_TIMEOUT_S = 30.0


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


def dump_process(pid: int, spy: str, *, timeout_s: float = DUMP_TIMEOUT_S) -> dict[str, Any]:
    """One process's threads (innermost frame first), or why not."""
    try:
        r = subprocess.run(
            [spy, "dump", "--nonblocking", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy did not answer in {timeout_s:.0f} s"}
    except OSError as e:
        return {"error": f"cannot run py-spy: {e}"}
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        return {"error": "py-spy: " + (" / ".join(why[-2:]) if why else f"exit {r.returncode}")[:1900]}
    try:
        return {"threads": _threads(json.loads(r.stdout))}
    except (ValueError, AttributeError, TypeError) as e:
        return {"error": f"py-spy printed no stack list: {e}"[:1900]}


def collect(root_pid: int | None, *, request: int, node: str, runner_rank: int) -> StackReport:
    """Dumps of the trainer process and each Python descendant of it on this node."""
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
    for p in tree:
        if not _python(p):
            continue
        try:
            command = " ".join(p.cmdline())[:2000]
        except psutil.Error:
            command = ""
        got = dump_process(p.pid, spy)
        dumps.append(ProcessDump(pid=p.pid, rank=_rank(p), command=command, **got))
    return StackReport(request=request, node=node, runner_rank=runner_rank, processes=dumps)

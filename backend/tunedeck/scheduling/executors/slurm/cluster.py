"""What the Slurm cluster says, read from its own commands (`scontrol`, `squeue`, `sbatch`): never a
shell, every argument a list item. Parsing is kept apart from running, so each reader takes the
commands' text as they print it.

The server needs only the client commands and the cluster's `slurm.conf` (`SLURM_CONF` where it is
not in the default place); accounting (`sacct`, slurmdbd) is not needed.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 30.0
# Where a job no longer runs: it ended, however (squeue's long state names).
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"})
FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")
GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is its own."""


def client_env() -> dict[str, str]:
    """The environment Slurm's commands run in, and that a job inherits (sbatch exports it): none of
    tunedeck's settings (its token among them), and none of an allocation the server itself runs in."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TUNEDECK_") and not (k.startswith("SLURM_") and k != "SLURM_CONF")
    }


def run(*args: str, stdin: str | None = None) -> str:
    """A Slurm command's output; SlurmError with its own words when it fails."""
    try:
        done = subprocess.run(
            list(args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=client_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{args[0]}: {e}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{args[0]}: {said[-1] if said else f'exit status {done.returncode}'}")
    return done.stdout


def fields(line: str) -> dict[str, str]:
    """`scontrol show ... --oneliner`'s `Key=value Key=value` line as a mapping (a value may hold spaces,
    as a node's Reason does: it runs to the next `Key=`)."""
    found = list(FIELD.finditer(line))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def gpu_count(gres: str) -> int:
    """GPUs in a Gres string (`gpu:2`, `gpu:mi250:8(S:0-1)`, `gpu:a100:4,shard:8`); 0 for none."""
    return sum(int(n) for n in GPU_GRES.findall(gres or ""))


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str
    host: str
    state: str  # as scontrol says it: IDLE, MIXED, ALLOCATED, DOWN+NOT_RESPONDING, IDLE+DRAIN, ...
    gpus: int
    gpus_used: int
    cpus: int
    partitions: tuple[str, ...]
    features: tuple[str, ...] = ()
    reason: str | None = None

    @property
    def usable(self) -> bool:
        """Up and not drained: a job may be placed there."""
        flags = set(self.state.split("+"))
        return not flags & {
            "DOWN",
            "DRAIN",
            "DRAINED",
            "DRAINING",
            "FAIL",
            "FAILING",
            "NOT_RESPONDING",
            "FUTURE",
        }


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    state: str
    default: bool
    max_nodes: int | None  # per job; None: unlimited
    max_time: str  # UNLIMITED, or Slurm's [days-]hours:minutes:seconds


@dataclass
class JobState:
    """One Slurm job as squeue/scontrol tell it."""

    id: str
    state: str
    reason: str
    nodelist: str = ""
    exit_code: str = ""
    # When Slurm chose the job for preemption (scontrol's PreemptTime); None: never. A job that stops
    # within its partition's GraceTime after the warning ends COMPLETED or FAILED, not PREEMPTED:
    # this is what still says so.
    preempted_at: str | None = None
    partition: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def pending(self) -> bool:
        return self.state in PENDING


def seconds(text: str) -> int | None:
    """A Slurm time (`--time`, a partition's MaxTime) in seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM
    or D-HH:MM:SS as sbatch(1) reads them; None for UNLIMITED/INFINITE and what is no time."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", ""):
        return None
    days, _, rest = text.rpartition("-")
    try:
        parts = [int(x) for x in rest.split(":")]
        d = int(days) if days else 0
    except ValueError:
        return None
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:  # MM
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:  # MM:SS
        h, m, s = 0, *parts
    else:
        h, m, s = parts[:3]
    return ((d * 24 + h) * 60 + m) * 60 + s


def parse_nodes(text: str) -> list[SlurmNode]:
    out = []
    for line in text.splitlines():
        f = fields(line)
        if "NodeName" not in f:
            continue
        reason = f.get("Reason")
        out.append(
            SlurmNode(
                name=f["NodeName"],
                addr=f.get("NodeAddr") or f["NodeName"],
                host=f.get("NodeHostName") or f["NodeName"],
                state=f.get("State", "UNKNOWN"),
                gpus=gpu_count(f.get("Gres", "")),
                gpus_used=gpu_count(f.get("GresUsed", "")) or _tres_gpus(f.get("AllocTRES", "")),
                cpus=int(f.get("CPUTot") or 0),
                partitions=tuple(p for p in f.get("Partitions", "").split(",") if p),
                features=tuple(x for x in f.get("AvailableFeatures", "").split(",") if x and x != "(null)"),
                reason=reason if reason and reason != "(null)" else None,
            )
        )
    return out


def _tres_gpus(tres: str) -> int:
    m = re.search(r"(?:^|,)gres/gpu=(\d+)", tres or "")
    return int(m.group(1)) if m else 0


def parse_partitions(text: str, nodes: list[SlurmNode]) -> list[Partition]:
    out = []
    for line in text.splitlines():
        f = fields(line)
        if "PartitionName" not in f:
            continue
        name = f["PartitionName"]
        max_nodes = f.get("MaxNodes", "UNLIMITED")
        out.append(
            Partition(
                name=name,
                nodes=tuple(n.name for n in nodes if name in n.partitions),
                state=f.get("State", "UP"),
                default=f.get("Default") == "YES",
                max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
                max_time=f.get("MaxTime", "UNLIMITED"),
            )
        )
    return out


@dataclass(frozen=True)
class Queued:
    """One line of squeue: a job of ours, pending, running or just ended."""

    id: str
    name: str
    state: str
    reason: str
    nodelist: str
    comment: str


def parse_squeue(text: str) -> dict[str, Queued]:
    """`squeue -h -o %i|%j|%T|%r|%N|%k` lines by job id."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) == 6:
            q = Queued(*(p.strip() for p in parts))
            out[q.id] = q
    return out


def parse_job(text: str) -> JobState | None:
    f = fields(" ".join(text.split()))
    if "JobId" not in f:
        return None
    return JobState(
        id=f["JobId"],
        state=f.get("JobState", "UNKNOWN"),
        reason=f.get("Reason", "None"),
        nodelist=f.get("NodeList", "") if f.get("NodeList") != "(null)" else "",
        exit_code=f.get("ExitCode", ""),
        preempted_at=f.get("PreemptTime") if f.get("PreemptTime") not in (None, "None", "Unknown") else None,
        partition=f.get("Partition", ""),
    )


class Cluster:
    """The live readers: one command each."""

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(run("scontrol", "show", "node", "--oneliner"))

    def partitions(self, nodes: list[SlurmNode] | None = None) -> list[Partition]:
        return parse_partitions(
            run("scontrol", "show", "partition", "--oneliner"), nodes if nodes is not None else self.nodes()
        )

    def queue(self, user: str) -> dict[str, Queued]:
        """Every job of `user` squeue still lists (pending, running, and ended ones for MinJobAge)."""
        return parse_squeue(run("squeue", "-h", "-a", "-t", "all", "-u", user, "-o", "%i|%j|%T|%r|%N|%k"))

    def job(self, job_id: str) -> JobState | None:
        """What scontrol says of one job; None once Slurm has forgotten it."""
        try:
            return parse_job(run("scontrol", "show", "job", "--oneliner", job_id))
        except SlurmError:
            return None

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        run("scancel", *([f"--signal={signal}", "--full"] if signal else []), job_id)

    def hostnames(self, nodelist: str) -> list[str]:
        return [h for h in run("scontrol", "show", "hostnames", nodelist).split() if h]

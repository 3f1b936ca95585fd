"""What runs on the job's nodes, inside the Slurm allocation (as the Ray actor does on a Ray node).

`python -m tunedeck.scheduling.executors.slurm.node batch RUN_DIR` is the batch script's command, on
the allocation's first node: it finds the rendezvous (that node's address as Slurm knows it, a port
free there) and replaces itself with `srun --ntasks-per-node=1 ... task RUN_DIR`, one task per node.

`... task RUN_DIR` is each node's task: its rank is Slurm's task id; it completes the runner
configuration the server wrote for that rank (the GPUs Slurm bound, the rendezvous, the node's name),
takes its runner's token from the file the server left for it (and removes the file), starts the
runner with the token on a pipe, and waits for it.

Cancel: a Slurm signal reaches every process of a step (proctrack signals the whole tree), so the
trainer would get it too, and LLaMA-Factory stops gracefully on SIGABRT only from its workers. The
server asks for a graceful stop through the run folder instead (`CANCEL`): each task then sends
SIGTERM to its own runner, which runs the usual SIGABRT → SIGTERM → SIGKILL sequence on its node.
The time-limit warning (SIGUSR1, `slurm_warn_s` before the limit) is the runner's: it stops the trainer
after the step with a checkpoint, which the next attempt resumes (services/jobs/resume.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tunedeck import procs
from tunedeck.contract import runfiles
from tunedeck.contract.protocol import RunnerConfig, node_name

CANCEL = "cancel.requested"  # in the run folder: the server's graceful stop, for every node's task
TOKEN = "runner.token"  # ranked(): one per rank, read once by its task and removed
LOOK_S = 1.0  # how often a task looks for CANCEL (the run folder may be on NFS: no inotify)


def job_key(run_dir: str, rank: int) -> str:
    """Rank 0 keeps the run folder as its key; each other rank has its own (as on Ray)."""
    return run_dir if rank == 0 else f"{run_dir}#rank{rank}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def slurm(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=60).stdout


def node_addr(name: str) -> str:
    """A node's address as Slurm knows it (NodeAddr): a node name need not resolve as a host name."""
    for word in slurm("scontrol", "show", "node", "--oneliner", name).split():
        if word.startswith("NodeAddr="):
            return word.removeprefix("NodeAddr=")
    return name


def bound_gpus(env: dict[str, str]) -> str | None:
    """The GPUs Slurm gave this task, as CUDA/HIP_VISIBLE_DEVICES: what it set itself (task/cgroup),
    else the GRES indices it names (SLURM_STEP_GPUS, SLURM_JOB_GPUS), else the first N by count
    (SLURM_GPUS_ON_NODE); None where it bound none (a CPU job)."""
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if env.get(name):
            return env[name]
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(name):
            return env[name]
    count = env.get("SLURM_GPUS_ON_NODE", "")
    if count.isdigit() and int(count) > 0:
        return ",".join(str(i) for i in range(int(count)))
    return None


def batch(run_dir: str) -> None:
    env = dict(os.environ)
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
    first = slurm("scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]).split()[0]
    env["TUNEDECK_SLURM_MASTER_ADDR"] = node_addr(first)
    env["TUNEDECK_SLURM_MASTER_PORT"] = str(free_port())  # this is the first node: the batch host
    argv = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",  # one rank gone: the step ends on every node
        sys.executable,
        "-m",
        "tunedeck.scheduling.executors.slurm.node",
        "task",
        run_dir,
    ]
    os.execvpe("srun", argv, env)


def task(run_dir: str) -> int:
    folder = Path(run_dir)
    env = dict(os.environ)
    rank = int(env.get("SLURM_PROCID", "0"))
    cfg = RunnerConfig.read(folder, rank)
    given = dict(cfg.env)
    gpus = bound_gpus(env)
    if gpus is not None:
        given["CUDA_VISIBLE_DEVICES"] = given["HIP_VISIBLE_DEVICES"] = gpus
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
    if nodes > 1:
        given.update(
            FORCE_TORCHRUN="1",
            NNODES=str(nodes),
            NODE_RANK=str(rank),
            NPROC_PER_NODE=str(max(len(gpus.split(",")) if gpus else 1, 1)),
            MASTER_ADDR=env["TUNEDECK_SLURM_MASTER_ADDR"],
            MASTER_PORT=env["TUNEDECK_SLURM_MASTER_PORT"],
        )
    name = node_name(env.get("SLURMD_NODENAME") or socket.gethostname())
    cfg.model_copy(update={"env": given, "node": name}).write(folder)
    token_file = folder / runfiles.ranked(TOKEN, rank)
    try:
        token = token_file.read_text().strip()
        token_file.unlink()
    except OSError as e:
        print(f"[tunedeck slurm] rank {rank} on {name}: no runner token ({e})", file=sys.stderr)
        return 2
    if (folder / CANCEL).exists():  # cancelled while Slurm was starting it
        return 0
    log = folder / runfiles.ranked(runfiles.RUNNER_LOG, rank)
    # The time-limit warning (`--signal=USR1@N`) would end this task and a runner not yet listening:
    # ignored until the runner is up (it inherits that, then takes the signal itself), then passed on.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    runner = procs.start_runner(cfg.train_python, run_dir, [str(rank)], job_key(run_dir, rank), token, log)
    stopping = False

    def stop(_signum=None, _frame=None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            try:
                runner.send_signal(signal.SIGTERM)
            except OSError:
                pass

    signal.signal(signal.SIGTERM, stop)  # Slurm's own end (a time limit, scancel): the runner's too

    def warned(_signum=None, _frame=None) -> None:  # the runner may have had it from Slurm too: once is taken
        try:
            runner.send_signal(signal.SIGUSR1)
        except OSError:
            pass

    signal.signal(signal.SIGUSR1, warned)
    while True:
        try:
            return runner.wait(timeout=LOOK_S)
        except subprocess.TimeoutExpired:
            if (folder / CANCEL).exists():
                stop()


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("batch", "task"):
        sys.exit("usage: python -m tunedeck.scheduling.executors.slurm.node batch|task RUN_DIR")
    if sys.argv[1] == "batch":
        batch(sys.argv[2])
    sys.exit(task(sys.argv[2]))


if __name__ == "__main__":
    main()

"""`llamafactory-cli train` with two callbacks of ours, run by path with the trainer's Python.

LLaMA-Factory's graceful stop (SIGABRT in web-UI mode) ends training after the step and saves the
adapter only, so a stop at step 120 could resume from checkpoint-100 at best. `SaveOnStop` stops
every rank after the same whole step and asks the Trainer for a regular checkpoint there (adapter,
optimizer, scheduler, RNG, ZeRO shards). `ExtraLog` writes the numbers LLaMA-Factory's trainer_log.jsonl leaves out
(grad_norm, ...), one line per logging event, so line i of both files is the same event.

Run as `python lf_train.py train.yaml`. Under torchrun (same rule as LLaMA-Factory's launcher:
FORCE_TORCHRUN or more than one visible device) it starts torchrun on this same file.
This file imports nothing of tunedeck: the trainer's Python need not have it installed.
"""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import subprocess
import sys
import time

EXTRA_LOG = "tunedeck_log.jsonl"
# A build lock this old, in a folder where no process works, was left by a build that was killed.
STALE_BUILD_LOCK_S = 60.0
# Keys trainer_log.jsonl carries already (under its own names) or that are not numbers to chart.
LOGGED = {"loss", "eval_loss", "learning_rate", "epoch", "total_flos"}


def _enabled(name: str, default: str = "0") -> bool:
    return os.getenv(name, default).lower() in ("true", "y", "1")


def _callbacks():
    from transformers import TrainerCallback

    class SaveOnStop(TrainerCallback):
        """Takes over LLaMA-Factory's stop: every rank stops after the same whole step, and saves.

        LLaMA-Factory's own handler stops each process where the signal finds it, even inside
        gradient accumulation; ranks that got it a step apart would wait on each other's collectives.
        Here the signal only raises a flag; at each step's end the ranks agree on it (one all-reduce
        of a scalar when there are several), then all stop and save a checkpoint of that step."""

        def __init__(self) -> None:
            self.stopping = False
            self.installed = False

        def on_train_begin(self, args, state, control, **kwargs):
            # Replaces the handler LogCallback installed when it was made (in web-UI mode only).
            if callable(signal.getsignal(signal.SIGABRT)):
                signal.signal(signal.SIGABRT, self._flag)
                self.installed = True

        def _flag(self, signum, frame) -> None:
            self.stopping = True

        def _agreed(self, args) -> bool:
            if args.world_size <= 1:
                return self.stopping
            import torch
            import torch.distributed as dist

            flag = torch.tensor([1.0 if self.stopping else 0.0], device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item())

        def _keep(self) -> None:
            # Set again at each step: a fault handler enabled meanwhile (torch's elastic error handler
            # calls faulthandler.enable) takes SIGABRT over below Python, and would die of it.
            if self.installed:
                signal.signal(signal.SIGABRT, self._flag)

        def on_prediction_step(self, args, state, control, **kwargs):
            self._keep()  # a cancel during an evaluation: flagged, not fatal

        def on_step_end(self, args, state, control, **kwargs):
            self._keep()
            if self._agreed(args):
                control.should_epoch_stop = control.should_training_stop = True
                control.should_save = True

    class ExtraLog(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if args.should_save:
                os.makedirs(args.output_dir, exist_ok=True)
                path = os.path.join(args.output_dir, EXTRA_LOG)
                if os.path.exists(path):
                    os.remove(path)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # Written before LogCallback's (asynchronous) line: the runner finds it when it reads that.
            if not args.should_save:
                return
            row = {
                k: v
                for k, v in (logs or {}).items()
                if k not in LOGGED
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
            }
            row["step"] = state.global_step
            with open(os.path.join(args.output_dir, EXTRA_LOG), "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    return [SaveOnStop(), ExtraLog()]


def _torchrun(yaml_path: str) -> int:
    from llamafactory.extras.misc import find_available_port, get_device_count

    env = dict(os.environ)
    if _enabled("OPTIM_TORCH", "1"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    argv = [
        "torchrun",
        "--nnodes",
        os.getenv("NNODES", "1"),
        "--node_rank",
        os.getenv("NODE_RANK", "0"),
        "--nproc_per_node",
        os.getenv("NPROC_PER_NODE", str(get_device_count())),
        "--master_addr",
        os.getenv("MASTER_ADDR", "127.0.0.1"),
        "--master_port",
        os.getenv("MASTER_PORT", str(find_available_port())),
        os.path.abspath(__file__),
        yaml_path,
    ]
    # The runner reads this line as the start of the wait for the other ranks (tunedeck/runner/phases.py):
    # torchrun itself says nothing until the process group is up.
    print(
        f"tunedeck: starting torchrun: {argv[6]} process(es) on node {argv[4]} of {argv[2]}, "
        f"rendezvous at {argv[8]}:{argv[10]}",
        file=sys.stderr,
        flush=True,
    )
    return subprocess.run(argv, env=env).returncode


def _working_folders() -> set[str] | None:
    """The working folders of the processes this user can see; None where /proc cannot tell."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    folders = set()
    for pid in pids:
        try:
            folders.add(os.path.realpath(os.readlink(f"/proc/{pid}/cwd")))
        except OSError:
            continue  # gone, or another user's
    return folders


def clear_stale_build_locks(root: str | None = None) -> list[str]:
    """Removes the build locks a killed build left; returns the paths removed.

    torch builds a C++ extension (DeepSpeed's JIT ops: the CPU comm op of every DeepSpeed run on the
    CPU, cpu_adam for offload, ...) under a lock that is a plain file, `<build folder>/lock`. A build
    killed midway (a job cancelled or killed while it compiled) leaves the file, and every later
    build of that op waits on it forever: the next DeepSpeed job hangs before its first step. The
    builder runs ninja and the compilers in the build folder, so a lock is stale when it is older
    than STALE_BUILD_LOCK_S and no process works in that folder."""
    if root is None:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        if not root:
            from torch.utils.cpp_extension import get_default_build_root

            root = get_default_build_root()
    # <root>/<name>/lock under TORCH_EXTENSIONS_DIR; <root>/py311_cpu/<name>/lock by default.
    locks = glob.glob(os.path.join(root, "*", "lock")) + glob.glob(os.path.join(root, "*", "*", "lock"))
    if not locks:
        return []
    working = _working_folders()
    if working is None:
        return []
    removed = []
    for lock in locks:
        try:
            age = time.time() - os.stat(lock).st_mtime
        except OSError:
            continue
        if age < STALE_BUILD_LOCK_S or os.path.realpath(os.path.dirname(lock)) in working:
            continue
        try:
            os.remove(lock)
        except OSError:
            continue
        removed.append(lock)
        print(
            f"tunedeck: removed {lock}, a build lock {age:.0f} s old with no build running in its "
            "folder (a build was killed there); the op builds again",
            file=sys.stderr,
            flush=True,
        )
    return removed


def _without_ray() -> None:
    """LLaMA-Factory (and transformers) import Ray whenever it is installed, to offer USE_RAY. tunedeck
    places jobs itself (torchrun across nodes, even on a Ray cluster), so outside USE_RAY the trainer
    is kept from it: Ray's import costs seconds and hundreds of MB of address space, and fails outright
    under a tight memory limit or next to a PyPI amdsmi without ROCm. A None in sys.modules is
    Python's way to block an import: find_spec answers None and `import ray` raises ImportError."""
    if not _enabled("USE_RAY"):
        sys.modules.setdefault("ray", None)  # type: ignore[arg-type]  # None blocks the import (above)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python lf_train.py TRAIN_YAML", file=sys.stderr)
        return 2
    _without_ray()
    if "LOCAL_RANK" not in os.environ:  # not a torchrun worker: decide like LLaMA-Factory's launcher
        clear_stale_build_locks()
        from llamafactory.extras.misc import get_device_count

        if (
            _enabled("USE_MCA")
            or _enabled("FORCE_TORCHRUN")
            or (get_device_count() > 1 and not _enabled("USE_RAY"))
        ):
            return _torchrun(sys.argv[1])
    _run(sys.argv[1])
    return 0


def _ddp_timeout(yaml_path: str) -> float:
    """The run's own `ddp_timeout` (transformers' default 1800 s): the group made here is the run's."""
    import yaml

    try:
        with open(yaml_path, encoding="utf-8") as f:
            value = (yaml.safe_load(f) or {}).get("ddp_timeout", 1800)
        return float(value)
    except (OSError, ValueError, TypeError, AttributeError):
        return 1800.0


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) < 8 else f"{ranks[0]}–{ranks[-1]} ({len(ranks)} ranks)"


def collective_check(yaml_path: str | None = None) -> str:
    """Before training, when TUNEDECK_COLLECTIVE_CHECK is on under torchrun: every rank says it is
    there (host and rank, in the rendezvous store) within TUNEDECK_COLLECTIVE_TIMEOUT_S, else the job
    fails at once naming the ranks that never came, instead of waiting out `ddp_timeout`. Then one
    all-reduce of TUNEDECK_COLLECTIVE_MB megabytes, timed over a few rounds, gives the bus bandwidth
    (the nccl-tests convention: bytes × 2(n−1)/n per second). The process group it made is the run's
    (accelerate reuses an initialised one), with the run's `ddp_timeout`. Returns the line it logged."""
    import datetime
    import socket

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wait_s = float(os.getenv("TUNEDECK_COLLECTIVE_TIMEOUT_S", "120"))
    started = time.monotonic()
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=datetime.timedelta(seconds=wait_s)))
    except Exception as e:  # the store's own master waits for every rank to connect: none came in time
        raise RuntimeError(
            f"tunedeck collective check: rank {rank} could not meet the other {world - 1} rank(s) at "
            f"{os.getenv('MASTER_ADDR')}:{os.getenv('MASTER_PORT')} within {wait_s:.0f} s ({e})"
        ) from None
    store.set(f"tunedeck/joined/{rank}", socket.gethostname())
    keys = [f"tunedeck/joined/{r}" for r in range(world)]
    missing = list(range(world))
    while missing and time.monotonic() - started < wait_s:
        missing = [r for r in missing if not store.check([keys[r]])]
        if missing:
            time.sleep(0.2)
    if missing:
        local = int(os.getenv("LOCAL_WORLD_SIZE", "1")) or 1
        nodes = sorted({r // local for r in missing})
        raise RuntimeError(
            f"tunedeck collective check: rank(s) {_ranks(missing)} (node_rank {_ranks(nodes)}) did not join "
            f"within {wait_s:.0f} s; the other ranks were ready"
        )
    cuda = torch.cuda.is_available()
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=_ddp_timeout(yaml_path) if yaml_path else 1800.0),
    )
    size = int(float(os.getenv("TUNEDECK_COLLECTIVE_MB", "16")) * 2**20) // 4
    device = torch.device("cuda", int(os.getenv("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    data = torch.ones(size, dtype=torch.float32, device=device)
    dist.all_reduce(data)  # warm-up: connections and buffers
    rounds = 5
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(data)
    if cuda:
        torch.cuda.synchronize(device)
    took = (time.perf_counter() - t0) / rounds
    ok = bool(torch.allclose(data[:16].cpu(), torch.full((16,), float(world) ** (rounds + 1))))
    hosts = sorted({store.get(k).decode() for k in keys})
    busbw = 4 * size * 2 * (world - 1) / world / took
    line = (
        f"tunedeck collective check: all-reduce over {world} ranks on {len(hosts)} node(s) "
        f"({dist.get_backend()}, {4 * size / 2**20:.0f} MiB): {busbw / 1e9:.2f} GB/s bus bandwidth, "
        f"{took * 1e3:.1f} ms per round{'' if ok else '; THE SUM WAS WRONG'}"
    )
    if rank == 0:
        print(line, flush=True)
    if not ok:
        raise RuntimeError(line)
    return line


# torch's flight recorder (TORCH_FR_BUFFER_SIZE, or the older TORCH_NCCL_TRACE_BUFFER_SIZE) keeps each
# rank's last collectives. On a stack-dump request the runner writes a number to FLIGHT_REQUEST in the
# run folder; a thread of each rank answers with the recorder's JSON dump in flight_recorder_rank_<RANK>.json
# (torch's own JSON, never its pickle). The thread runs while the main thread waits in a collective: torch
# releases the GIL there.
FLIGHT_REQUEST = "flight_recorder.request"
FLIGHT_ANSWER = "flight_recorder_rank_{rank}.json"


def flight_recorder_on(env=os.environ) -> bool:
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return size.isdigit() and int(size) > 0


def _flight_dumps() -> list:
    """The recorder's entries of every backend this torch has (NCCL's and the CPU/gloo one)."""
    import torch._C._distributed_c10d as c10d

    out = []
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            out.append(json.loads(dump()))
        except Exception as e:  # a backend this build has but this run never made
            out.append({"error": f"{name}: {e}"[:500]})
    return out


def answer_flight_requests(folder: str, rank: int, poll_s: float = 0.5) -> None:
    """Forever: each new request number in FLIGHT_REQUEST is answered with this rank's dumps."""
    request = os.path.join(folder, FLIGHT_REQUEST)
    answer = os.path.join(folder, FLIGHT_ANSWER.format(rank=rank))
    done = 0
    while True:
        try:
            with open(request, encoding="utf-8") as f:
                asked = int(f.read().strip() or 0)
        except (OSError, ValueError):
            asked = 0
        if asked > done:
            body = json.dumps({"request": asked, "rank": rank, "dumps": _flight_dumps()})
            tmp = f"{answer}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(body)
            os.replace(tmp, answer)
            done = asked
        time.sleep(poll_s)


def start_flight_answers(folder: str | None = None) -> bool:
    """Under torchrun with the flight recorder on: answer the runner's requests from a daemon thread."""
    if not flight_recorder_on() or "RANK" not in os.environ:
        return False
    import threading

    threading.Thread(
        target=answer_flight_requests,
        args=(folder or os.getcwd(), int(os.environ["RANK"])),
        name="tunedeck-flight-recorder",
        daemon=True,
    ).start()
    return True


def _run(yaml_path: str) -> None:
    from llamafactory.train.tuner import run_exp

    start_flight_answers()
    if _enabled("TUNEDECK_COLLECTIVE_CHECK") and int(os.getenv("WORLD_SIZE", "1")) > 1:
        collective_check(yaml_path)
    sys.argv = [sys.argv[0], yaml_path]  # LLaMA-Factory reads the YAML named on the command line
    run_exp(callbacks=_callbacks())


if __name__ == "__main__":
    sys.exit(main())

"""The runner's own cost: the same CPU fine-tune launched by tunedeck (its runner samples memory, tails
trainer_log.jsonl and posts both to the server) and by bare `llamafactory-cli train`, in pairs.

Each pair runs the job through a real local server first, then the exact train.yaml that job ran,
pointed at a fresh output folder, under the same environment its trainer had (read from the running
trainer's /proc: thread counts, offline flags), with nothing of tunedeck around it. The figure compared
is LLaMA-Factory's own `train_samples_per_second` from each run's train_results.json (the training
loop only: model loading, evaluation at the end and start-up are outside it). The order alternates
(tunedeck first, then bare first) so a drift of the machine's speed falls on both. Prints every run,
the runner's CPU seconds, the pairs' ratios and their median, with the load average beside them.

    PYTHONPATH=backend:trainer python bench/runner_overhead.py [--pairs 3] [--steps 2000] [--logging-steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml
from _common import Server, assets, demo_config

SERVER_CPU: list[float] = []  # the server's CPU seconds over each run through tunedeck
# The trainer's environment that is tunedeck's and not the training's: left out of the bare run.
OURS = ("TUNEDECK_",)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cli() -> str:
    beside = Path(sys.executable).parent / "llamafactory-cli"
    return str(beside) if beside.exists() else "llamafactory-cli"


def samples_per_second(output_dir: Path) -> float:
    return float(json.loads((output_dir / "train_results.json").read_text())["train_samples_per_second"])


def watch(run_dir: str, deadline_s: float = 1800) -> tuple[dict[str, str], float]:
    """While the job runs: its trainer's environment, and its runner's CPU seconds (its own, not its
    children's), read until it exits."""
    env: dict[str, str] = {}
    runner: psutil.Process | None = None
    cpu = 0.0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        procs = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("TUNEDECK_JOB_KEY") == run_dir:
                    procs.append(p)
            except psutil.Error:
                continue
        for p in procs:
            try:
                line = " ".join(p.cmdline())
                if not env and "lf_train.py" in line:
                    env = p.environ()
                if runner is None and "tunedeck.runner" in line:
                    runner = p
            except psutil.Error:
                continue
        if runner is not None:
            try:
                if runner.status() == psutil.STATUS_ZOMBIE:
                    return env, cpu  # exited (not yet reaped by the server): its last reading stands
                t = runner.cpu_times()
                cpu = t.user + t.system
            except psutil.Error:
                return env, cpu  # exited and reaped
        time.sleep(0.2)
    raise AssertionError(f"the job in {run_dir} did not end in {deadline_s:.0f} s")


def server_cpu(server: Server) -> float:
    """CPU seconds of the server's own processes (the store process too), not its jobs' runners."""
    assert server.proc is not None
    root = psutil.Process(server.proc.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            if "TUNEDECK_JOB_KEY" in p.environ():
                continue
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def through_tunedeck(server: Server, steps: int, every: int) -> tuple[float, float, str, dict[str, str]]:
    config = demo_config(
        assets(), max_steps=steps, logging_steps=every, eval_steps=100_000, save_steps=100_000
    )
    spec = {"name": "overhead", "config": config, "gpus": 0}
    before = server_cpu(server)
    job = server.submit(spec)
    env, runner_cpu = watch(job["run_dir"])
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=1800)
    assert done["status"] == "succeeded", done
    SERVER_CPU.append(server_cpu(server) - before)
    train_yaml = server.api.get(f"/api/jobs/{job['id']}/config").json()["train_yaml"]
    return samples_per_second(Path(done["output_dir"])), runner_cpu, train_yaml, env


def bare(train_yaml: str, env: dict[str, str], folder: Path) -> float:
    config = yaml.safe_load(train_yaml)
    config["output_dir"] = str(folder / "output")
    path = folder / "train.yaml"
    folder.mkdir(parents=True)
    path.write_text(yaml.safe_dump(config))
    clean = {k: v for k, v in env.items() if not k.startswith(OURS)} or dict(os.environ)
    subprocess.run([cli(), "train", str(path)], cwd=folder, env=clean, check=True, capture_output=True)
    return samples_per_second(folder / "output")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    # The demo model trains ~25 steps a second on 2 cores: 2000 steps is ~80 s of training, and a line
    # every 10 steps is 2-3 a second (a GPU run of a real model logs far less often).
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--logging-steps", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="runner-overhead-"))
    server = Server(root / "ws", assets()).start()
    ratios, cpus, ours_all, bare_all = [], [], [], []
    print(
        f"{args.steps} steps a run, a line every {args.logging_steps}, {args.pairs} pairs; "
        f"load before: {loadavg()}",
        flush=True,
    )
    try:
        # A first job unmeasured (the model's files into the page cache, the imports compiled), whose
        # train.yaml at the full length is what a pair that starts bare runs.
        _, _, train_yaml, env = through_tunedeck(server, 5, args.logging_steps)
        train_yaml = train_yaml.replace("max_steps: 5\n", f"max_steps: {args.steps}\n")
        for i in range(args.pairs):
            bare_first = i % 2 == 1
            if bare_first:
                theirs = bare(train_yaml, env, root / f"bare{i}")
            ours, cpu, train_yaml, env = through_tunedeck(server, args.steps, args.logging_steps)
            if not bare_first:
                theirs = bare(train_yaml, env, root / f"bare{i}")
            ratios.append(ours / theirs)
            cpus.append(cpu)
            ours_all.append(ours)
            bare_all.append(theirs)
            print(
                f"pair {i + 1} ({'bare' if bare_first else 'tunedeck'} first): tunedeck {ours:.3f} samples/s "
                f"(runner {cpu:.1f} s CPU, server {SERVER_CPU[-1]:.1f} s), bare {theirs:.3f} samples/s, ratio {ours / theirs:.3f}; "
                f"load {loadavg()}",
                flush=True,
            )
    finally:
        server.stop()
    print(
        f"median: tunedeck {statistics.median(ours_all):.3f}, bare {statistics.median(bare_all):.3f} "
        f"samples/s; ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"runner CPU {statistics.median(cpus):.1f} s, server {statistics.median(SERVER_CPU[1:]):.1f} s a run; "
        f"load after: {loadavg()}"
    )


if __name__ == "__main__":
    main()

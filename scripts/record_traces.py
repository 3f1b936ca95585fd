"""Re-record the real LLaMA-Factory traces under tests/alerts/traces/ and label them from what each run
did (read off its trainer_log.jsonl, never from the alert engine).

Run in the training environment (it starts `llamafactory-cli`, found beside this Python)::

    python scripts/record_traces.py --assets /work/assets [--only nan healthy]

Each run is the CPU demo preset (configs/demo_cpu.yaml) on the tiny demo model
(`python -m tunedeck_train.demo build --workspace ASSETS`), with the overrides in RUNS, started as
`llamafactory-cli train train.yaml` with HF_HUB_OFFLINE=1 in a fresh output folder. The host memory
of the process tree (RSS, sampled every 0.5 s) is kept as memory.csv on "GPU -1".
Each trace folder holds train.yaml (the exact config, paths replaced by ASSETS/OUT),
trainer_log.jsonl, memory.csv and labels.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "configs" / "demo_cpu.yaml"
OUT = ROOT / "tests" / "alerts" / "traces"
COMMON = {
    "max_steps": 40,
    "logging_steps": 1,
    "eval_steps": 10,
    "save_steps": 1000,
    "plot_loss": False,
    "overwrite_output_dir": True,
    "seed": 42,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
}
# name -> overrides of the preset and COMMON (what makes the run do what it does).
RUNS: dict[str, dict[str, Any]] = {
    "healthy_lr0.1": {"learning_rate": 0.1},
    "stuck_lr1": {"learning_rate": 1.0},
    "stuck_lr30": {"learning_rate": 30.0},
    # fp16 on the CPU: accepted (the model is loaded in float16), 10 steps with the preset's warm-up.
    "fp16_cpu": {
        "fp16": True,
        "max_steps": 10,
        "eval_steps": 5,
        "learning_rate": 5.0e-3,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 15,
    },
    # Full fine-tuning, no gradient clipping: lr 0.3 blows the loss up to 12 at step 4, then it learns.
    "spike_full_lr0.3": {
        "finetuning_type": "full",
        "learning_rate": 0.3,
        "max_grad_norm": 0.0,
        "max_steps": 30,
    },
    "diverge_full_lr5": {
        "finetuning_type": "full",
        "learning_rate": 5.0,
        "max_grad_norm": 0.0,
        "max_steps": 30,
    },
    "diverge_full_lr1": {
        "finetuning_type": "full",
        "learning_rate": 1.0,
        "max_grad_norm": 0.0,
        "max_steps": 30,
    },
}


def sample_rss(
    pid: int, out: list[tuple[float, int]], log: Path, start: list[float], stop: threading.Event
) -> None:
    """RSS of the process and its children every 0.5 s, until stop; and when training started (the
    first trainer_log.jsonl line's arrival less its elapsed_time) into `start`."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.wait(0.5):
        if not start and log.is_file() and (first := log.read_text().split("\n", 1)[0]).endswith("}"):
            h, m, sec = json.loads(first)["elapsed_time"].split(":")
            start.append(time.time() - (int(h) * 3600 + int(m) * 60 + int(sec)))
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            return
        if total:  # 0: every process of the tree has exited
            out.append((time.time(), total))


def record(name: str, overrides: dict, assets: Path, cli: Path) -> Path:
    config = yaml.safe_load(PRESET.read_text())
    work = Path(tempfile.mkdtemp(prefix=f"trace-{name}-"))
    config.update(
        model_name_or_path=str(assets / "demo" / "model"),
        dataset_dir=str(assets / "demo" / "data"),
        output_dir=str(work / "out"),
        **{**COMMON, **overrides},
    )
    if config["finetuning_type"] != "lora":
        config.pop("lora_target", None)
    (work / "train.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DISABLE_VERSION_CHECK": "1"}
    rss: list[tuple[float, int]] = []
    start: list[float] = []
    stop = threading.Event()
    with open(work / "train.log", "wb") as log:
        proc = subprocess.Popen(
            [str(cli), "train", str(work / "train.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )
        sampler = threading.Thread(
            target=sample_rss,
            args=(proc.pid, rss, work / "out" / "trainer_log.jsonl", start, stop),
            daemon=True,
        )
        sampler.start()
        code = proc.wait()
        stop.set()
        sampler.join()
    # `tunedeck analyze` places elapsed_time 0 at the first memory sample: keep those from then on.
    rss = [(t - start[0], b) for t, b in rss if t >= start[0]] if start else []
    dest = keep(name, config, (work / "out" / "trainer_log.jsonl").read_text(), rss, code, overrides)
    shutil.rmtree(work, ignore_errors=True)
    return dest


def keep(
    name: str, config: dict, lines: str, rss: list[tuple[float, int]], code: int, overrides: dict
) -> Path:
    """Write the trace folder: the config as run (paths shown as ASSETS/OUT), the log, memory, labels."""
    dest = OUT / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "trainer_log.jsonl").write_text(lines)
    shown = dict(
        config, model_name_or_path="ASSETS/demo/model", dataset_dir="ASSETS/demo/data", output_dir="OUT"
    )
    (dest / "train.yaml").write_text(yaml.safe_dump(shown, sort_keys=False))
    if rss:  # seconds since training started
        (dest / "memory.csv").write_text(
            "t,gpu,used_bytes,total_bytes\n" + "".join(f"{t:.2f},-1,{b},\n" for t, b in rss)
        )
    labels = label(lines)
    labels.update(exit_code=code, command="llamafactory-cli train train.yaml", overrides=overrides)
    (dest / "labels.json").write_text(json.dumps(labels, indent=2) + "\n")
    return dest


def label(trainer_log: str) -> dict:
    """What the run did, from its logged losses: the kinds it shows and a sentence for each."""
    rows = [json.loads(x) for x in trainer_log.splitlines() if x.strip()]
    train = [(r["current_steps"], float(r["loss"])) for r in rows if "loss" in r]
    kinds: dict[str, str] = {}
    bad = next(
        (
            (r["current_steps"], k)
            for r in rows
            for k in ("loss", "eval_loss")
            if k in r and not math.isfinite(float(r[k]))
        ),
        None,
    )
    if bad:
        kinds["loss_nan"] = f"{bad[1]} became {rows_value(rows, bad)} at step {bad[0]}"
    finite = [(s, v) for s, v in train if math.isfinite(v)]
    if len(finite) >= 10:
        lowest = min(finite[:-5], key=lambda x: x[1])
        last = sum(v for _, v in finite[-5:]) / 5
        if last >= 2 * lowest[1]:
            kinds["loss_divergence"] = (
                f"the last 5 losses (to step {finite[-1][0]}) average {last:.4g}, "
                f"{last / lowest[1]:.1f} times the lowest before them ({lowest[1]:.4g} at step {lowest[0]})"
            )
        tail = [v for _, v in finite[-20:]]
        if max(tail) - min(tail) <= 0.005 * abs(tail[-1]) and tail[-1] >= 0.9 * finite[0][1]:
            kinds["loss_stuck"] = (
                f"the last 20 losses (to step {finite[-1][0]}) stay within {max(tail) - min(tail):.3g} of "
                f"{tail[-1]:.4g}, {100 * tail[-1] / finite[0][1]:.0f} % of the first loss"
            )
    healthy = not kinds and len(finite) == len(train) and finite and finite[-1][1] < finite[0][1]
    return {
        "kinds": kinds,
        "healthy": bool(healthy),
        "first_loss": train[0][1] if train else None,
        "last_loss": train[-1][1] if train else None,
        "points": len(rows),
    }


def rows_value(rows: list[dict], bad: tuple[int, str]) -> str:
    v = next(float(r[bad[1]]) for r in rows if r["current_steps"] == bad[0] and bad[1] in r)
    return "NaN" if math.isnan(v) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--assets", type=Path, required=True, help="the folder `tunedeck_train.demo build` wrote demo/ in"
    )
    ap.add_argument("--only", nargs="*", choices=sorted(RUNS), help="some of the runs (default: all)")
    args = ap.parse_args()
    cli = Path(sys.executable).with_name("llamafactory-cli")
    for name in args.only or RUNS:
        dest = record(name, RUNS[name], args.assets.resolve(), cli)
        print(name, json.dumps(json.loads((dest / "labels.json").read_text())["kinds"]), flush=True)


if __name__ == "__main__":
    main()

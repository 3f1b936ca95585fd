"""Sampler cost in % of one CPU core, at 1 Hz and 10 Hz (each sample = the max of `polls` polls).

    python bench/sampler_cost.py [--seconds 20] [--backends cpu,rocm]

Each case runs in a fresh interpreter: imports first, then the process's CPU time is read before
and after `seconds` of sampling while the main thread sleeps, so the difference is the sampler's.
Backends: `cpu` (psutil over a real 3-process tree), `rocm` (pyrsmi's real code over the
stand-in amdsmi in tests/fakes: our overhead and pyrsmi's, not the driver's ~1 ms per query) and
`gpu` (this machine's own GPUs through whichever SMI library opens, driver included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = r"""
import json, os, subprocess, sys, time, psutil
from tunedeck.telemetry.sampler import Sampler
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
gpus = sys.argv[1] != "cpu"
s = Sampler(interval_s=float(sys.argv[2]), polls=int(sys.argv[3]), gpus=gpus, visible=[0, 1] if gpus else None,
            root_pid=None if gpus else os.getpid()).start()
s.ready.wait(10)
time.sleep(1.0)
me = psutil.Process()
c0, w0 = sum(me.cpu_times()[:2]), time.monotonic()
time.sleep(float(sys.argv[4]))
c1, w1 = sum(me.cpu_times()[:2]), time.monotonic()
s.stop()
n = len(s.drain())
for k in kids:
    k.kill()
print(json.dumps({"backend": s.backend_name, "cpu_s": c1 - c0, "wall_s": w1 - w0, "samples": n}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--polls", type=int, default=4)
    ap.add_argument(
        "--backends", default="cpu,rocm", help="comma-separated: cpu, rocm (stand-in), gpu (this machine's)"
    )
    args = ap.parse_args()
    GiB = 1024**3
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        trace.write_text(
            json.dumps(
                {
                    "mode": "calls",
                    "devices": [
                        {
                            "name": "AMD Instinct MI300X",
                            "bdf": f"0000:{b:02x}:00.0",
                            "total": 192 * GiB,
                            "vram": [40 * GiB] * 10,
                            "activity": 50,
                            "power": 500,
                            "temp": 60,
                        }
                        for b in (0x0C, 0x1C)
                    ],
                }
            )
        )
        print(f"{'backend':<8} {'rate':>6} {'polls/s':>8} {'% of one core':>14} {'samples':>8}")
        for backend in args.backends.split(","):
            for hz in (1, 10):
                path = [str(ROOT / "tests" / "fakes")] if backend == "rocm" else []
                inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([*path, str(ROOT / "backend"), *inherited]),
                    "TUNEDECK_FAKE_SMI_TRACE": str(trace),
                }
                r = subprocess.run(
                    [sys.executable, "-c", CASE, backend, str(1 / hz), str(args.polls), str(args.seconds)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                d = json.loads(r.stdout.strip().splitlines()[-1])
                assert d["backend"] == backend or (backend == "gpu" and d["backend"] != "cpu"), d
                print(
                    f"{d['backend']:<8} {hz:>4} Hz {hz * args.polls:>8} {100 * d['cpu_s'] / d['wall_s']:>13.2f}% "
                    f"{d['samples']:>8}"
                )


if __name__ == "__main__":
    main()

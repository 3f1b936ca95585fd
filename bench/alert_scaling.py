"""Alert CPU per new point against the length of the stored series.

One 8-GPU job in a real SQLite file grows to each size in turn (memory samples at 1 Hz per GPU with
noise and a spike every 16 s, a trainer_log point every 5 s). At each size the server's tracker,
already following the job, is handed new runner batches (10 s of samples each) and evaluates after
every one, as the alert engine does on ingest: the CPU of those evaluations per new point must not
grow with the series. The one-off rebuild of the state from the stored series (what a server start
costs, and what every pass cost before the detectors streamed) is printed beside it.

    python bench/alert_scaling.py [--sizes 10000,100000,1000000,10000000] [--batches 40]

10M is not in the default sizes: storing 10M rows and the one-off rebuild take a few minutes on a
loaded 2-core machine (measured, load 3-4: 132 µs per new point at 10M against 87 at 1M and 81 at
100k; the rebuild 4.2 µs a stored point). A batch here is 10 samples a GPU: what it costs is the
evaluation's own (findings, storing the alerts), not the detectors' per sample (bench/ingest_cpu.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlmodel import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tunedeck.alerts import Limits
from tunedeck.services.alerting.tracker import Tracker
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus, MemorySample, MetricPoint, core

GiB = 1024**3
GPUS = 8
T0 = 1_800_000_000.0
BATCH_S = 10  # seconds of samples in one runner batch


class Job8:
    """The synthetic job's series, generated second by second and stored in chunks."""

    def __init__(self, engine, job_id: int):
        self.engine, self.job_id, self.s = engine, job_id, 0
        self.rng = np.random.default_rng(0)

    def store(self, seconds: int) -> int:
        t = T0 + np.arange(self.s, self.s + seconds, dtype=np.float64)
        rows = []
        for gpu in range(GPUS):
            y = 60 * GiB + self.rng.normal(0, 0.1 * GiB, seconds)
            y[(t - T0) % 16 == 3] += 20 * GiB
            rows += [
                {
                    "job_id": self.job_id,
                    "line": int(k) * GPUS + gpu,
                    "t": float(tk),
                    "gpu": gpu,
                    "used_bytes": int(v),
                    "total_bytes": 192 * GiB,
                }
                for k, tk, v in zip(t - T0, t, y)
            ]
        rows.sort(key=lambda r: r["line"])
        pts = [
            {
                "job_id": self.job_id,
                "line": int(k) // 5,
                "t": float(tk),
                "step": int(k) // 5,
                "loss": 1.0 + float(np.exp(-k / 5000)),
                "raw": "{}",
            }
            for k, tk in zip(t - T0, t)
            if int(k) % 5 == 0
        ]
        with self.engine.begin() as conn:
            conn.execute(core(MemorySample).insert(), rows)
            if pts:
                conn.execute(core(MetricPoint).insert(), pts)
        self.s += seconds
        return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", default="10000,100000,1000000", help="stored memory samples at which to measure"
    )
    ap.add_argument("--batches", type=int, default=40, help="new batches evaluated at each size")
    args = ap.parse_args()
    sizes = sorted(int(x) for x in args.sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(Path(tmp) / "bench.db")
        upgrade(engine)
        with Session(engine) as s:
            job = Job(
                name="bench",
                spec="{}",
                status=JobStatus.running,
                devices=",".join(map(str, range(GPUS))),
                train_yaml="gradient_accumulation_steps: 8\nper_device_train_batch_size: 2\n",
            )
            s.add(job)
            s.commit()
            job_id = job.id
        gen = Job8(engine, job_id)
        tracker = Tracker(engine, Limits())
        print(
            f"{'stored points':>14} {'alert µs/new point':>19} {'p95 ms/batch':>13} {'rebuild s':>10} "
            f"{'rebuild µs/point':>17}  findings"
        )
        results = []
        stored = 0
        for size in sizes:
            while stored < size:  # grow in chunks; not timed
                stored += gen.store(min(20_000, (size - stored) // GPUS + 1))
            fresh = Tracker(engine, Limits())  # what a server start pays once
            c0 = time.process_time()
            fresh.evaluate(job_id, now=T0 + gen.s)
            rebuild = time.process_time() - c0
            if tracker.seen is None:
                tracker = fresh
            else:
                tracker.evaluate(job_id, now=T0 + gen.s)  # catch up with the growth, not timed
            cpu, per, new = 0.0, [], 0
            for _ in range(args.batches):
                new += gen.store(BATCH_S)
                c0 = time.process_time()
                tracker.evaluate(job_id, now=T0 + gen.s)
                dt = time.process_time() - c0
                cpu += dt
                per.append(dt)
            stored += new
            kinds = sorted({f.kind for f in tracker.jobs[job_id].run.findings(running=True, now=T0 + gen.s)})
            us = 1e6 * cpu / new
            p95 = 1e3 * sorted(per)[int(0.95 * (len(per) - 1))]
            print(
                f"{size:>14,} {us:>19.1f} {p95:>13.1f} {rebuild:>10.2f} {1e6 * rebuild / size:>17.2f}  {','.join(kinds)}",
                flush=True,
            )
            results.append(
                {
                    "stored": size,
                    "alert_us_per_new_point": round(us, 2),
                    "p95_ms_per_batch": round(p95, 2),
                    "rebuild_s": round(rebuild, 3),
                }
            )
        print(json.dumps(results))


if __name__ == "__main__":
    main()

"""Chart tiles against series length: ingest cost and the first chart read, 10k to 10M points.

For each size, a fresh SQLite file gets one job with N metric rows (loss, lr, tokens/s by step) and
N memory samples (one GPU at 1 Hz, with spikes), stored in chunks by executemany and tiled after
each chunk in the same transaction, as the ingest writer does. Then:

- ingest: µs per row for the raw insert and for tiling it, in bulk chunks and in live-sized batches
  (8 samples, as an 8-GPU node sends every second);
- first chart read: `metric_series` and the memory chart with max_points 2000, each on a new engine
  (no SQLite page cache of an earlier read, no answer cache), for the whole run and ~20 random zoom
  windows: p50 / p95 in ms; and that the window's spike is in the answer.

    python bench/chart_scaling.py [--sizes 10000,100000,1000000,10000000] [--max 1000000]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend"))

from tunedeck.services.charts import pyramid
from tunedeck.services.charts.memory import chart
from tunedeck.services.charts.metrics import metric_series
from tunedeck.store.db import make_engine, upgrade

T0 = 1_800_000_000.0
CHUNK = 20_000
GiB = 1 << 30


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def fill(engine, n: int, rng: np.random.Generator) -> dict[str, float]:
    """Store and tile n metric rows and n memory samples; seconds spent inserting and tiling."""
    spent = {"insert": 0.0, "tile": 0.0, "tile cpu": 0.0}
    with engine.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at, "
            "last_batch_seq) VALUES (1, 'big', 'succeeded', 1, '{}', '', '', '', '2026-01-01 00:00:00', -1)"
        )
    for lo in range(0, n, CHUNK):
        i = np.arange(lo, min(n, lo + CHUNK))
        loss = 3 * np.exp(-i / (n / 5)) + 0.5 + rng.random(len(i)) * 0.1 + 4.0 * (i % 99_991 == 7)
        used = (32 * GiB + rng.integers(-(2**28), 2**28, len(i)) + 16 * GiB * (i % 77_777 == 11)).tolist()
        metrics = list(
            zip(
                i.tolist(),
                (T0 + i).tolist(),
                (i + 1).tolist(),
                loss.tolist(),
                (2e-4 * (1 - i / n)).tolist(),
                (1500 + rng.random(len(i)) * 100).tolist(),
            )
        )
        memory = list(zip(i.tolist(), (T0 + i).tolist(), used))
        with engine.begin() as c:
            t = time.perf_counter()
            c.exec_driver_sql(
                "INSERT INTO metric_points (job_id, line, t, step, total_steps, loss, lr, throughput, raw) "
                f"VALUES (1, ?, ?, ?, {n}, ?, ?, ?, '{{}}')",
                metrics,
            )
            c.exec_driver_sql(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes) "
                f"VALUES (1, ?, ?, 0, ?, {80 * GiB})",
                memory,
            )
            spent["insert"] += time.perf_counter() - t
            t, cpu = time.perf_counter(), time.process_time()
            pyramid.catch_up(c)
            spent["tile"] += time.perf_counter() - t
            spent["tile cpu"] += time.process_time() - cpu
    return spent


def live(engine, n: int, batches: int = 200) -> float:
    """CPU µs per sample to tile live-sized batches: 8 GPUs' samples of one second, one transaction each."""
    spent = 0.0
    for b in range(batches):
        rows = [(n + 8 * b + g, T0 + n + b, g, 30 * GiB + g) for g in range(8)]
        with engine.begin() as c:
            c.exec_driver_sql(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes) VALUES (1, ?, ?, ?, ?)", rows
            )
            t = time.process_time()
            pyramid.catch_up(c)
            spent += time.process_time() - t
    return 1e6 * spent / (8 * batches)


def reads(db: Path, n: int, rnd: random.Random, k: int = 20) -> dict[str, list[float]]:
    """Milliseconds of each first read: wall clock under "<kind>", CPU of this process under "<kind> cpu"
    (on a shared machine the wall clock also counts waiting for a core)."""
    out: dict[str, list[float]] = {
        f"{w} {kind}{c}": [] for w in ("metric", "memory") for kind in ("full", "zoom") for c in ("", " cpu")
    }
    wins = [(None, None)] + [tuple(sorted(rnd.sample(range(1, n + 1), 2))) for _ in range(k)]
    for x0, x1 in wins:
        kind = "full" if x0 is None else "zoom"
        engine = make_engine(db)  # a new connection: nothing cached from the previous read
        t, c = time.perf_counter(), time.process_time()
        s = metric_series(engine, job_id=1, max_points=2000, x0=x0, x1=x1)
        out[f"metric {kind}"].append(1000 * (time.perf_counter() - t))
        out[f"metric {kind} cpu"].append(1000 * (time.process_time() - c))
        loss = s["series"]["loss"]
        assert len(loss["y"]) <= 2000 and loss["n"] == (n if x0 is None or x1 is None else x1 - x0 + 1)
        spikes = [i + 1 for i in range(7, n, 99_991) if x0 is None or x1 is None or x0 <= i + 1 <= x1]
        assert set(spikes) <= set(loss["step"]), "a loss spike was lost"
        engine.dispose()
        engine = make_engine(db)
        t0, t1 = (None, None) if x0 is None or x1 is None else (T0 + x0 - 1, T0 + x1 - 1)
        t, c = time.perf_counter(), time.process_time()
        rows, _, _ = chart(engine, job_id=1, gpu=None, max_points=2000, t0=t0, t1=t1)
        out[f"memory {kind}"].append(1000 * (time.perf_counter() - t))
        out[f"memory {kind} cpu"].append(1000 * (time.process_time() - c))
        peaks = {T0 + i for i in range(11, n, 77_777) if t0 is None or t1 is None or t0 <= T0 + i <= t1}
        assert peaks <= {r.t for r in rows}, "a memory spike was lost"
        engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000,10000000")
    ap.add_argument("--max", type=int, default=None, help="skip sizes above this")
    ap.add_argument("--windows", type=int, default=20)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if args.max is None or int(s) <= args.max]
    rnd, rng = random.Random(0), np.random.default_rng(0)
    print("first chart read, max_points 2000: wall ms (CPU ms); zoom: p50/p95 over the windows")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "t.db"
            engine = make_engine(db)
            upgrade(engine)
            spent = fill(engine, n, rng)
            r = reads(db, n, rnd, args.windows)
            tiled_live = live(engine, n)
            engine.dispose()
            mib = db.stat().st_size / 2**20
            rows = 2 * n  # metric rows and memory samples

            def fmt(key: str) -> str:
                w, c = r[key], r[f"{key} cpu"]  # noqa: B023
                if len(w) == 1:
                    return f"{w[0]:.0f} ({c[0]:.0f})"
                return f"{pct(w, 50):.0f}/{pct(w, 95):.0f} ({pct(c, 50):.0f}/{pct(c, 95):.0f})"

            print(
                f"{n:>10,} points: insert {1e6 * spent['insert'] / rows:.1f} µs/row, tile "
                f"{1e6 * spent['tile'] / rows:.1f} µs/row ({1e6 * spent['tile cpu'] / rows:.1f} CPU), live "
                f"batches {tiled_live:.0f} CPU µs/sample | metric full {fmt('metric full')}, zoom "
                f"{fmt('metric zoom')} | memory full {fmt('memory full')}, zoom {fmt('memory zoom')} | "
                f"db {mib:,.0f} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()

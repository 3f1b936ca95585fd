"""What the start's database check costs on a long history: the full check (SQLite's quick_check,
every page read: TUNEDECK_INTEGRITY_CHECK=start) against the header-and-schema check a start makes by
default (the full one then runs beside the serving server).

    python bench/start_check.py --mib 1024

Builds a SQLite file of about `--mib` MiB (rows of random bytes in an indexed table, as metric and
memory rows are) in a temporary folder, then times each check `--runs` times, cold of Python's own
caches but warm in the OS page cache (a server restart's case), and prints the medians.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from tunedeck.store.db import check_file

ROW = 48  # bytes of payload per row: about a memory sample's columns (the index entries come beside)


def build(path: Path, mib: int) -> None:
    rows = mib * 2**20 // (ROW + 40)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE samples (id INTEGER PRIMARY KEY, job INTEGER, t REAL, data BLOB)")
        conn.execute("CREATE INDEX samples_job_t ON samples (job, t)")
        batch = 20000
        for start in range(0, rows, batch):
            conn.executemany(
                "INSERT INTO samples (job, t, data) VALUES (?, ?, ?)",
                ((i % 50, float(i), os.urandom(ROW)) for i in range(start, min(rows, start + batch))),
            )
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def timed(path: Path, deep: bool, runs: int) -> float:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        assert check_file(path, deep=deep) is None
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tunedeck.db"
        t0 = time.perf_counter()
        build(path, args.mib)
        size = path.stat().st_size / 2**20
        print(f"built {size:.0f} MiB in {time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.2f}")
        full = timed(path, True, args.runs)
        quick = timed(path, False, args.runs)
        print(f"full check (quick_check, TUNEDECK_INTEGRITY_CHECK=start): {full:.2f} s median of {args.runs}")
        print(
            f"start's check (header and schema, the default):         {quick * 1e3:.1f} ms median of {args.runs}"
        )
        print(f"per GiB: full {full / (size / 1024):.2f} s")


if __name__ == "__main__":
    main()

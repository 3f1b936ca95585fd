"""Server CPU per one-value-a-row sample, stage by stage, in this process (no HTTP, no other load).

    .venv/bin/python bench/ingest_cpu.py [--jobs 8] [--batches 40] [--batch 2000]
    PYTHONPATH=/other/checkout/backend .venv/bin/python bench/ingest_cpu.py   # the same on other code

On a busy machine a server's wall-clock throughput says more about its neighbours than about it;
the CPU time of each stage, measured here on a real SQLite file, does not. Stages: the request's
decode and validation (JSON columns, and the packed form runners send: tunedeck.contract.wire), the
writer's insert, chart tiles and commit (grouped transactions as the ingest writer commits them,
the WAL synced), and the alert engine's pass (read back the new rows, feed the detectors), then
the cost of one evaluation of a job with nothing new.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import memory_body
from sqlmodel import Session

from tunedeck.config import Settings
from tunedeck.contract import wire
from tunedeck.contract.protocol import TelemetryBatch
from tunedeck.services.alerting.tracker import Tracker, limits_of
from tunedeck.services.charts import pyramid
from tunedeck.services.ingest.writer import apply_batch, durable, plain
from tunedeck.store import bulk
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--batches", type=int, default=40, help="batches a job")
    ap.add_argument("--batch", type=int, default=2000, help="samples a batch (8 GPUs)")
    args = ap.parse_args()
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-ingest-cpu-"))
    engine = make_engine(ws / "t.db")
    upgrade(engine)
    with Session(engine) as s:
        ids = []
        for i in range(args.jobs):
            job = Job(
                name=f"j{i}", status=JobStatus.running, spec="{}", train_yaml="", devices="0,1,2,3,4,5,6,7"
            )
            s.add(job)
            s.flush()
            ids.append(job.id)
        s.commit()
    bodies = [
        (j, memory_body(k, k * args.batch, args.batch, 1.8e9, "columns"))
        for k in range(args.batches)
        for j in ids
    ]
    n = len(bodies) * args.batch
    # Two trackers: one fed by the writer's columns after each commit (as the server does), one that
    # reads the stored rows back (the server's fallback, and how it worked before).
    tracker, reader = (Tracker(engine, limits_of(Settings(workspace=ws))) for _ in range(2))
    for t in (tracker, reader):
        t.pull()
        with Session(engine) as s:
            for j in ids:
                t.build(s.get_one(Job, j))

    packed = [wire.encode(json.loads(b)) for _, b in bodies]
    stages: dict[str, float] = {}
    c = time.process_time()
    batches = [plain(TelemetryBatch.model_validate(json.loads(b))) for _, b in bodies]
    json_s = time.process_time() - c
    c = time.process_time()
    batches = []
    for b in packed:
        head, mem = wire.decode(b)
        batches.append({**plain(head), "memory": mem})
    stages["decode + validate (packed)"] = time.process_time() - c
    insert = tiles = commit = take = 0.0
    for i in range(0, len(bodies), 16):  # the writer commits whatever is waiting, together
        with engine.begin() as conn:
            durable(conn)
            c = time.process_time()
            fresh = pyramid.Fresh(pyramid.newest_sample(conn))
            for (j, _), batch in zip(bodies[i : i + 16], batches[i : i + 16]):
                apply_batch(conn, j, batch)
                fresh.add(j, batch["memory"])
            fresh.seal(conn)
            c1 = time.process_time()
            pyramid.catch_up(conn, fresh)
            c2 = time.process_time()
        c3 = time.process_time()
        commit += c3 - c2
        insert, tiles = insert + c1 - c, tiles + c2 - c1
        if not tracker.take(fresh):
            raise SystemExit("the writer's columns were not taken: the bench no longer measures that path")
        take += time.process_time() - c3
    c = time.process_time()
    tracker.settle()  # (what the detectors have not been handed yet: an evaluation would)
    take += time.process_time() - c
    stages["insert"], stages["chart tiles"], stages["commit (WAL synced)"] = insert, tiles, commit
    stages["alerts (fed the columns)"] = take
    c = time.process_time()
    reader.pull()
    read_back = time.process_time() - c
    for j in ids:  # both ways find the same
        if tracker.jobs[j].run.findings(running=True, now=2e9) != reader.jobs[j].run.findings(
            running=True, now=2e9
        ):
            raise SystemExit(f"job {j}: fed columns and read-back rows found different alerts")
    # The floor of the read back: the same rows fetched into tuples, nothing done with them.
    c = time.process_time()
    with engine.connect() as conn:
        cur = bulk.driver_cursor(conn)
        cur.execute(
            "SELECT id, job_id, gpu, t, used_bytes, coalesce(total_bytes, 0), name, node FROM memory_samples"
        )
        while cur.fetchmany(65536):
            pass
    fetch_s = time.process_time() - c
    c = time.process_time()
    for _ in range(10):
        for j in ids:
            tracker.evaluate(j)
    per_eval = (time.process_time() - c) / (10 * len(ids))
    print(f"{n:,} samples, {args.jobs} jobs x 8 GPUs, batches of {args.batch}")
    for name, sec in stages.items():
        print(f"  {name:36s} {1e6 * sec / n:6.2f} µs CPU a value")
    print(f"  {'total':36s} {1e6 * sum(stages.values()) / n:6.2f} µs CPU a value")
    print(f"  (decode + validate of the same batches as JSON columns: {1e6 * json_s / n:.2f} µs CPU a value)")
    print(
        f"  (alerts from the stored rows read back instead: {1e6 * read_back / n:.2f} µs CPU a value, "
        f"of which the rows' bare fetch from SQLite {1e6 * fetch_s / n:.2f})"
    )
    print(f"  one evaluation of a job (8 GPUs) with nothing new: {1e3 * per_eval:.1f} ms CPU")


if __name__ == "__main__":
    main()

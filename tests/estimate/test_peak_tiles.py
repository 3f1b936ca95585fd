"""The measured peak is read from the chart tiles' top level, not by scanning a long run's samples:
it must equal the brute-force maximum over the raw rows (the device, its name and the bytes)."""

from __future__ import annotations

import random

from sqlalchemy import text
from sqlmodel import Session

from tunedeck.services.charts.estimates import measured_peak
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus, MemorySample, MetricPoint

GiB = 2**30


def job(session: Session, gpus: int) -> Job:
    j = Job(name="j", spec="{}", train_yaml="", status=JobStatus.running, gpus=gpus)
    session.add(j)
    session.commit()
    return j


def brute(session: Session, job_id: int) -> dict | None:
    row = session.execute(
        text("SELECT gpu, used_bytes FROM memory_samples WHERE job_id = :j ORDER BY used_bytes DESC LIMIT 1"),
        {"j": job_id},
    ).first()
    if row is None or not row[1]:
        return None
    name = session.execute(
        text("SELECT name FROM memory_samples WHERE job_id = :j AND gpu = :g ORDER BY t DESC LIMIT 1"),
        {"j": job_id, "g": row[0]},
    ).scalar()
    kind = "cpu" if row[0] == -1 else (name or "gpu")
    return {"bytes": row[1], "source": "memory_samples", "gpu_kind": kind}


def test_the_peak_from_tiles_equals_the_raw_maximum(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    rng = random.Random(0)
    with Session(engine) as session:
        jobs = [job(session, 2) for _ in range(6)]
        for k, j in enumerate(jobs):
            gpus = [-1] if k == 0 else list(range(rng.randint(1, 4)))
            rows, t = [], 1_800_000_000.0 + rng.uniform(0, 1e6)
            for i in range(rng.randint(50, 6000)):  # across many finest tiles and several coarse ones
                t += rng.choice([0.1, 1.0, 7.0, 300.0])
                g = rng.choice(gpus)
                rows.append(
                    {
                        "job_id": j.id,
                        "line": i,
                        "t": t,
                        "gpu": g,
                        "used_bytes": int(rng.uniform(1, 80) * GiB)
                        + (40 * GiB if rng.random() < 0.001 else 0),
                        "total_bytes": 192 * GiB,
                        "name": f"card {g}" if rng.random() < 0.9 else None,
                    }
                )
            session.execute(MemorySample.__table__.insert(), rows)
        session.commit()
        for j in jobs:
            got = measured_peak(session, j)
            assert got is not None and got == brute(session, j.id), j.id


def test_vram_reserved_stands_in_without_samples(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    rng = random.Random(1)
    with Session(engine) as session:
        j = job(session, 1)
        assert measured_peak(session, j) is None
        values = [rng.uniform(0, 60) for _ in range(3000)]
        session.execute(
            MetricPoint.__table__.insert(),
            [
                {"job_id": j.id, "line": i, "t": 1e9 + i, "step": i + 1, "vram_reserved": v, "raw": "{}"}
                for i, v in enumerate(values)
            ],
        )
        session.commit()
        assert measured_peak(session, j) == {
            "bytes": int(max(values) * GiB),
            "source": "vram_reserved",
            "gpu_kind": "gpu",
        }

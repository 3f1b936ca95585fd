"""A run from outside tunedeck stored as a finished job: its points, memory samples and alerts."""

from __future__ import annotations

import json

from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck.alerts import analyze
from tunedeck.alerts.rundir import build
from tunedeck.config import Settings
from tunedeck.models import Job, JobStatus, utcnow
from tunedeck.services import alerts as alert_service
from tunedeck.services.ingest import apply_batch


def import_run(engine: Engine, *, settings: Settings, name: str, trainer_log: str, memory_csv: str | None,
               config: str | None, log_text: str | None = None) -> Job:
    series, lines = build(trainer_log=trainer_log, memory_csv=memory_csv, config=config, log_text=log_text)
    now = utcnow()
    with Session(engine) as s:
        job = Job(name=name, status=JobStatus.succeeded, gpus=len(series.devices),
                  spec=json.dumps({"name": name, "config": series.config, "imported": True}),
                  train_yaml=config or "", devices=",".join(map(str, series.devices)) or None,
                  created_at=now, started_at=now, finished_at=now, exit_code=0)
        s.add(job)
        s.commit()
        s.refresh(job)
    batch = {
        "seq": 0,
        "metrics": [{"line": i, "t": x["t"], "raw": x["raw"]} for i, x in enumerate(lines)],
        "logs": [{"line": i, "t": t, "stream": "stdout", "text": text} for i, (t, text) in enumerate(series.logs)],
        "memory": [{"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
                   for i, (gpu, t, used, total) in enumerate(
                       (g, t, u, tot) for g, xs in sorted(series.memory.items()) for t, u, tot in xs)],
    }
    with engine.begin() as conn:
        apply_batch(conn, job.id, batch)
    with Session(engine) as s:
        # The same engine as live ingest; finished, so every alert is stored closed.
        alert_service.reconcile(s, job.id, analyze(series, alert_service.limits_of(settings)), finished=True)
        return s.get(Job, job.id)

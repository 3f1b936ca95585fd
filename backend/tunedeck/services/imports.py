"""A run from outside tunedeck stored as a finished job: its points, memory samples and alerts."""

from __future__ import annotations

import json

from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck import runfiles
from tunedeck.alerts import analyze
from tunedeck.alerts.rundir import build
from tunedeck.config import Settings
from tunedeck.models import Job, JobStatus, utcnow
from tunedeck.services import alerts as alert_service
from tunedeck.services import notify
from tunedeck.services.ingest import apply_batch
from tunedeck.services.jobs import slug


def import_run(engine: Engine, *, settings: Settings, name: str, trainer_log: str, memory_csv: str | None,
               config: str | None, log_text: str | None = None, owner: str | None = None) -> Job:
    series, lines = build(trainer_log=trainer_log, memory_csv=memory_csv, config=config, log_text=log_text)
    now = utcnow()
    with Session(engine) as s:
        job = Job(name=name, owner=owner, status=JobStatus.succeeded, gpus=len(series.devices),
                  spec=json.dumps({"name": name, "config": series.config, "imported": True}),
                  train_yaml=config or "", devices=",".join(map(str, series.devices)) or None,
                  created_at=now, started_at=now, finished_at=now, exit_code=0)
        s.add(job)
        s.flush()
        # A run folder like a launched job's (never "": an empty path would mean the server's cwd).
        run_dir = settings.runs_dir / f"{job.id:06d}-{slug(name)}"
        output = runfiles.output_dir(run_dir)
        output.mkdir(parents=True, exist_ok=True)
        (output / runfiles.TRAINER_LOG).write_text(trainer_log)
        for fname, text in ((runfiles.MEMORY_CSV, memory_csv), (runfiles.TRAIN_YAML, config),
                            (runfiles.TRAIN_LOG, log_text)):
            if text:
                (run_dir / fname).write_text(text)
        job.run_dir, job.output_dir = str(run_dir), str(output)
        samples = ((g, t, u, tot) for g, xs in sorted(series.memory.items()) for t, u, tot in xs)
        batch = {
            "seq": 0,
            "metrics": [{"line": i, "t": x["t"], "raw": x["raw"]} for i, x in enumerate(lines)],
            "logs": [{"line": i, "t": t, "stream": "stdout", "text": text} for i, (t, text) in enumerate(series.logs)],
            "memory": [{"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
                       for i, (gpu, t, used, total) in enumerate(samples)],
        }
        apply_batch(s.connection(), job.id, batch)  # one transaction: all of the run or nothing
        # The same engine as live ingest; the job is finished, so every alert is stored closed.
        new = alert_service.reconcile(s, job.id, analyze(series, alert_service.limits_of(settings)), finished=True)
        s.refresh(job)
        # The team hears of an imported run as of a live one: its alerts, then its end.
        notify.alerts_opened(job, new)
        notify.job_finished(job.id, status=job.status.value, error=None)
        return job

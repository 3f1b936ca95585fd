"""A run from outside tunedeck stored as a finished job: its points, memory samples and alerts."""

from __future__ import annotations

import json

from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck.alerts import analyze
from tunedeck.alerts.rundir import build
from tunedeck.alerts.training import OOM
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.services.alerting import engine as alert_service
from tunedeck.services.charts import pyramid
from tunedeck.services.ingest.writer import apply_batch
from tunedeck.services.jobs.jobstate import JobState, after_commit, move
from tunedeck.services.jobs.records import slug
from tunedeck.store.tables import Job, JobStatus


def import_run(
    engine: Engine,
    *,
    settings: Settings,
    name: str,
    trainer_log: str,
    memory_csv: str | None,
    config: str | None,
    log_text: str | None = None,
    owner: str | None = None,
    state: JobState | None = None,
) -> Job:
    """Store the run, then move the job to its end as a launched job ends (webhooks included)."""
    state = state or JobState(engine)
    series, lines = build(trainer_log=trainer_log, memory_csv=memory_csv, config=config, log_text=log_text)
    findings = analyze(series, alert_service.limits_of(settings))  # the same engine as live ingest
    # One transaction: all of the run or nothing, and nobody sees the job before it has ended.
    with state.begin() as conn, Session(bind=conn) as s:
        job = Job(
            name=name,
            owner=owner,
            gpus=len(series.devices),
            spec=json.dumps({"name": name, "config": series.config, "imported": True}),
            train_yaml=config or "",
            devices=",".join(map(str, series.devices)) or None,
        )
        s.add(job)
        s.flush()
        # A run folder like a launched job's (never "": an empty path would mean the server's cwd).
        run_dir = settings.runs_dir / f"{job.id:06d}-{slug(name)}"
        output = runfiles.output_dir(run_dir)
        output.mkdir(parents=True, exist_ok=True)
        (output / runfiles.TRAINER_LOG).write_text(trainer_log)
        for fname, text in (
            (runfiles.MEMORY_CSV, memory_csv),
            (runfiles.TRAIN_YAML, config),
            (runfiles.TRAIN_LOG, log_text),
        ):
            if text:
                (run_dir / fname).write_text(text)
        job.run_dir, job.output_dir = str(run_dir), str(output)
        s.flush()
        by_node: dict[str, list] = {}  # one batch per node, as its runner would have sent
        for key, xs in series.memory.items():
            node, gpu = key if isinstance(key, tuple) else ("", key)
            by_node.setdefault(node, []).extend((gpu, t, u, tot) for t, u, tot in xs)
        for node, samples in sorted(by_node.items())[1:]:
            samples.sort(key=lambda x: x[:2])
            memory = [
                {"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
                for i, (gpu, t, used, total) in enumerate(samples)
            ]
            apply_batch(conn, job.id, {"seq": 0, "node": node, "memory": memory})
        node, samples = min(by_node.items()) if by_node else ("", [])
        samples.sort(key=lambda x: x[:2])
        batch = {
            "node": node,
            "seq": 0,
            "metrics": [{"line": i, "t": x["t"], "raw": x["raw"]} for i, x in enumerate(lines)],
            "logs": [
                {"line": i, "t": t, "stream": "stdout", "text": text}
                for i, (t, text) in enumerate(series.logs)
            ],
            "memory": [
                {"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
                for i, (gpu, t, used, total) in enumerate(samples)
            ],
        }
        apply_batch(conn, job.id, batch)
        pyramid.catch_up(conn)  # its chart tiles, in the same transaction
        new = alert_service.reconcile(s, job.id, findings, finished=True)  # the run is over: stored closed
        if (
            state.notifier is not None
        ):  # the team hears of an imported run as of a live one: its alerts, then its end
            notifier = state.notifier
            after_commit(conn, lambda: notifier.alerts_opened(job, new))
        move(conn, job.id, JobStatus.running)
        if oom := _out_of_memory(
            series.logs
        ):  # a run that died of OOM did not succeed, whatever it logged before
            move(conn, job.id, JobStatus.failed, error=f"out of memory: {oom[:500]}")
        else:
            move(conn, job.id, JobStatus.succeeded, exit_code=0)
        s.refresh(job)
        s.expunge(job)
    return job


def _out_of_memory(logs: list[tuple[float, str]]) -> str | None:
    """The last out-of-memory line of the run's log, if it has one."""
    return next((text.strip() for _, text in reversed(logs) if OOM.search(text)), None)

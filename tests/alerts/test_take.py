"""The detectors fed in the ingest writer's thread from the columns it just stored find what a tracker
reading the same rows back finds; a batch whose samples were not all stored (a resend) is left to
the read back, never fed twice."""

from __future__ import annotations

import random

from sqlmodel import Session

from tests.alerts.corpus import generate
from tests.utils.wait import DEADLINE, until
from tunedeck.db import make_engine, upgrade
from tunedeck.services import alert_engine as alerts
from tunedeck.services.ingest import IngestWriter
from tunedeck.tables import Job, JobStatus

TRACES = ("single-spike", "periodic-ga4", "ramp-oom", "fragmentation")


def test_columns_fed_in_the_writer_find_what_the_stored_rows_find(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with Session(engine) as s:
        job = Job(name="j", spec="{}", train_yaml="", status=JobStatus.running, devices="0,1,2,3")
        s.add(job)
        s.commit()
        job_id = job.id
    corpus = {t.name.rsplit("-", 1)[0]: t for t in generate(3)}
    mems = [corpus[name].series.memory[0] for name in TRACES]  # one trace a device
    fed, read = (alerts.Tracker(engine, alerts.Limits()) for _ in range(2))
    for tracker in (fed, read):
        tracker.pull()
        with Session(engine) as s:
            tracker.build(s.get(Job, job_id))
    taken: list[bool] = []
    writer = IngestWriter(engine)
    writer.stored.append(lambda fresh: taken.append(fed.take(fresh)))
    writer.start()
    rng = random.Random(7)
    k = line = seq = resends = 0
    last = None
    try:
        while k < len(mems[0]):
            if last is not None and rng.random() < 0.1:  # a runner resending its last batch: nothing new
                batch, resends = last, resends + 1
            else:
                per = rng.choice((1, 3, 10, 40))
                rows = [(g, *m[i]) for i in range(k, min(k + per, len(mems[0]))) for g, m in enumerate(mems)]
                cols = {
                    "line": list(range(line, line + len(rows))),
                    "t": [r[1] for r in rows],
                    "gpu": [r[0] for r in rows],
                    "used_bytes": [r[2] for r in rows],
                    "total_bytes": [r[3] for r in rows],
                    "name": ["AMD Instinct MI300X"] * len(rows),
                }
                # Both forms a batch may carry: samples as rows or as columns.
                memory = cols if seq % 2 else [dict(zip(cols, v)) for v in zip(*cols.values())]
                batch = last = {"seq": seq, "memory": memory, "metrics": [], "logs": [], "states": []}
                k, line, seq = k + per, line + len(rows), seq + 1
            writer.submit(job_id, batch).result(timeout=DEADLINE)
            until(lambda: len(taken) == seq + resends, "the writer's hook to have run")
            read.pull()
    finally:
        writer.stop()
    assert resends and taken.count(False) == resends  # every resend left to the read back, nothing else
    got = fed.jobs[job_id].run.findings(running=True, now=mems[0][-1][0] + 1)
    want = read.jobs[job_id].run.findings(running=True, now=mems[0][-1][0] + 1)
    assert {f.kind for f in want} >= {"vram_spike", "vram_periodic_spikes", "vram_near_oom"}
    assert got == want
    assert fed.jobs[job_id].run.meta.gpu_names == {g: "AMD Instinct MI300X" for g in range(4)}

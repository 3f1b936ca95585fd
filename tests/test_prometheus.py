"""/metrics on a real server: what a runner posted comes back as Prometheus samples, behind the read rules."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.utils.servers import demo_config
from tests.utils.wait import until

GIB = 1 << 30


def viewer_token(workspace: Path) -> str:
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(workspace)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunedeck.cli.main",
            "token",
            "create",
            "--name",
            "grafana",
            "--role",
            "viewer",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def scrape(server, token: str) -> dict[str, list[tuple[dict, float]]]:
    r = server.api.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(found: dict, name: str, **labels: str) -> float:
    hits = [v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0]


def test_metrics_report_what_was_ingested(server_factory, assets, tmp_path):
    ws = tmp_path / "ws"
    token = viewer_token(ws)
    # The job's runner is a process that just stays alive: this test posts the telemetry a runner would.
    standin = tmp_path / "runner.sh"
    # The server hands a runner its token on stdin, once: the stand-in keeps it where this test reads it.
    standin.write_text(
        f'#!/bin/sh\nread -r token\nprintf %s "$token" > {tmp_path / "token"}\nexec sleep 3600\n'
    )
    standin.chmod(0o755)
    server = server_factory(
        TUNEDECK_OPEN_READ="false",
        TUNEDECK_TRAIN_PYTHON=str(standin),
        TUNEDECK_GPU_SLOTS="2",  # logical GPUs: the job's runner is a stand-in, its samples are this test's
        TUNEDECK_CPU_SLOTS="1",
    )
    api, auth = server.api, {"Authorization": f"Bearer {token}"}
    spec = {"name": "watched", "config": demo_config(assets), "gpus": 2}
    running = server.submit(spec)["id"]
    until(
        lambda: (j := api.get(f"/api/jobs/{running}", headers=auth).json())["status"] == "running" and j,
        "running job",
    )
    queued = [server.submit({**spec, "name": f"waiting {i}"})["id"] for i in range(2)]  # both GPUs are taken
    runner_token = until(
        lambda: (tmp_path / "token").is_file() and (tmp_path / "token").read_text(), "the runner's token"
    )

    now = time.time()
    lines = [
        {"current_steps": 1, "total_steps": 20, "loss": 2.5, "throughput": 1234.5},
        {"current_steps": 2, "total_steps": 20, "eval_loss": 2.25},
        {"current_steps": 3, "total_steps": 20, "loss": 2.0, "throughput": 1300.0},
    ]
    total = 80 * GIB
    gpu0 = [int(total * (0.96 + i / 1000)) for i in range(5)]  # sustained above 95%: a near-OOM alert
    gpu1 = [10 * GIB + i * 1024 for i in range(5)]
    memory = [
        {
            "line": 2 * i + g,
            "t": now - 5 + i,
            "gpu": g,
            "used_bytes": used[i],
            "total_bytes": total,
            "name": "Stand-in 80G",
        }
        for i in range(5)
        for g, used in ((0, gpu0), (1, gpu1))
    ]
    batch = {
        "seq": 0,
        "metrics": [{"line": i, "t": now - 3 + i, "raw": json.dumps(x)} for i, x in enumerate(lines)],
        "logs": [{"line": 0, "t": now, "stream": "stdout", "text": "training"}],
        "memory": memory,
    }
    r = api.post(
        f"/api/jobs/{running}/telemetry", json=batch, headers={"Authorization": f"Bearer {runner_token}"}
    )
    assert r.status_code == 200, r.text
    until(
        lambda: any(
            a["kind"] == "vram_near_oom" for a in api.get(f"/api/jobs/{running}/alerts", headers=auth).json()
        ),
        "near-OOM alert",
    )

    r = api.get("/metrics")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"  # reads are closed
    assert api.get("/metrics", headers={"Authorization": "Bearer tdk_forged"}).status_code == 401
    found = scrape(server, token)
    me = {"job_id": str(running), "job_name": "watched", "node": platform.node()}
    assert one(found, "tunedeck_job_info", **me, status="running") == 1
    assert one(found, "tunedeck_job_step", **me) == 3
    assert one(found, "tunedeck_job_total_steps", **me) == 20
    assert one(found, "tunedeck_job_loss", **me) == 2.0
    assert one(found, "tunedeck_job_eval_loss", **me) == 2.25
    assert one(found, "tunedeck_job_tokens_per_second", **me) == 1300.0
    for gpu, used in (("0", gpu0), ("1", gpu1)):
        assert one(found, "tunedeck_job_vram_used_bytes", **me, gpu=gpu, gpu_name="Stand-in 80G") == used[-1]
        assert one(found, "tunedeck_job_vram_total_bytes", **me, gpu=gpu) == total
    assert one(found, "tunedeck_jobs_queued") == 2 and one(found, "tunedeck_jobs_running") == 1
    assert not [lab for lab, _ in found["tunedeck_job_info"] if lab["job_id"] in map(str, queued)]
    stored = Counter(
        (a["kind"], a["severity"])
        for a in api.get("/api/alerts", params={"open": "true"}, headers=auth).json()
    )
    exported = {(lab["kind"], lab["severity"]): v for lab, v in found["tunedeck_alerts_open"]}
    assert stored[("vram_near_oom", "critical")] >= 1
    assert {k: v for k, v in exported.items() if v} == stored
    assert one(found, "tunedeck_ingest_batches_total") == 1
    assert one(found, "tunedeck_ingest_items_total") == len(lines) + len(memory) + 1
    assert one(found, "tunedeck_ingest_queue_batches") == 0 and one(found, "tunedeck_ingest_lag_seconds") == 0
    assert one(found, "tunedeck_sse_clients") == 0
    assert one(found, "process_resident_memory_bytes") > 0
    # The store process that wrote the batch, apart (process_* is the server's own process).
    assert one(found, "tunedeck_ingest_store_process_cpu_seconds_total") > 0
    assert one(found, "tunedeck_ingest_store_process_resident_memory_bytes") > 0

    # The detectors take the samples from the writer's columns (the build read the first batch's rows):
    # each further batch is one more chance, however the engine's passes fall.
    def fed_from_columns(seq=iter(range(1, 10**6))) -> float:
        k = next(seq)
        more = [{**m, "line": 10 * k + m["line"], "t": m["t"] + 5 * k} for m in memory]
        r = api.post(
            f"/api/jobs/{running}/telemetry",
            json={"seq": k, "memory": more},
            headers={"Authorization": f"Bearer {runner_token}"},
        )
        assert r.status_code == 200, r.text
        return one(scrape(server, token), "tunedeck_alert_samples_fed_total", path="columns")

    assert one(found, "tunedeck_alert_samples_fed_total", path="rows") >= len(memory)
    until(fed_from_columns, "samples fed from the writer's columns", interval=0.5)

    # A live stream counts while it is open.
    with api.stream("GET", "/api/stream", params={"job": running, "access_token": token}) as s:
        assert s.status_code == 200
        until(lambda: one(scrape(server, token), "tunedeck_sse_clients") == 1, "one SSE client")
    until(lambda: one(scrape(server, token), "tunedeck_sse_clients") == 0, "the SSE client gone")

    # A job that ended stays for a while with its final status, then its series end.
    assert api.post(f"/api/jobs/{queued[0]}/cancel").status_code == 200
    ended = {"job_id": str(queued[0]), "job_name": "waiting 0"}
    assert one(scrape(server, token), "tunedeck_job_info", **ended, status="cancelled") == 1
    with sqlite3.connect(ws / "tunedeck.db") as db:
        db.execute("UPDATE jobs SET finished_at = '2000-01-01 00:00:00.000000' WHERE id = ?", (queued[0],))
    assert not [
        lab for lab, _ in scrape(server, token)["tunedeck_job_info"] if lab["job_id"] == str(queued[0])
    ]


def test_not_finite_losses_and_the_tail_bound(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from sqlmodel import Session

    from tunedeck.services.ingest.writer import apply_batch
    from tunedeck.services.views.prometheus import TAIL_LINES, Collector
    from tunedeck.store.db import make_engine, upgrade
    from tunedeck.store.tables import Job, JobStatus

    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with Session(engine) as s:
        job = Job(name="diverged", spec="{}", train_yaml="", status=JobStatus.running)
        s.add(job)
        s.commit()
        job_id = job.id
    # json.dumps writes NaN and Infinity bare, as LLaMA-Factory's trainer_log does.
    raws = [json.dumps({"current_steps": 1, "eval_loss": 3.0}), json.dumps({"current_steps": 2, "loss": 2.0})]
    raws += [json.dumps({"current_steps": 3 + i, "loss": 1.5, "throughput": 10.0}) for i in range(TAIL_LINES)]
    raws += [json.dumps({"current_steps": 9999, "loss": float("nan"), "throughput": float("inf")})]
    with engine.begin() as conn:
        apply_batch(
            conn,
            job_id,
            {"seq": 0, "metrics": [{"line": i, "t": float(i), "raw": r} for i, r in enumerate(raws)]},
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(engine))
    found = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    me = {"job_id": str(job_id)}
    assert one(found, "tunedeck_job_loss", **me) != one(
        found, "tunedeck_job_loss", **me
    )  # NaN, not the 1.5 before
    assert one(found, "tunedeck_job_tokens_per_second", **me) == float("inf")
    assert "tunedeck_job_eval_loss" not in found  # older than the last TAIL_LINES lines: not looked for
    assert one(found, "tunedeck_job_step", **me) == 9999

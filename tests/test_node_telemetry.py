"""A job on two nodes: each node's runner posts memory samples of its own GPU 0 with its own sample
numbers, over the real telemetry route. Both series are kept apart, resends are stored once, alerts
and the job page name the node."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import closing
from http.server import HTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.utils.browser import shot
from tests.utils.servers import demo_config
from tests.utils.wait import until
from tests.utils.webhooks import Receiver

GIB = 1 << 30
TOTAL = 80 * GIB
N = 8


@pytest.fixture
def hooks():
    """A webhook receiver: what the server posts on alerts."""
    Receiver.got = []
    http = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{http.server_address[1]}/hook", Receiver.got
    http.shutdown()


@pytest.fixture
def two_node_job(server_factory, assets, tmp_path, hooks):
    """A running job whose runner is a stand-in that hands this test its token."""
    standin = tmp_path / "runner.sh"
    standin.write_text(
        f'#!/bin/sh\nread -r token\nprintf %s "$token" > {tmp_path / "token"}\nexec sleep 3600\n'
    )
    standin.chmod(0o755)
    server = server_factory(
        TUNEDECK_TRAIN_PYTHON=str(standin),
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_CPU_SLOTS="1",
        TUNEDECK_WEBHOOK_URLS=json.dumps([hooks[0]]),
    )
    job = server.submit({"name": "two nodes", "config": demo_config(assets), "gpus": 0})["id"]
    server.wait(job, ("running",))
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db, db:
        # What a Ray placement records (the local executor runs one node): one GPU on each of two nodes.
        db.execute("UPDATE jobs SET gpus = 1, nodes = 2 WHERE id = ?", (job,))
    token = until(lambda: (tmp_path / "token").is_file() and (tmp_path / "token").read_text(), "runner token")
    return server, job, {"Authorization": f"Bearer {token}"}, hooks[1]


def memory(t0: float, used: list[int], first_line: int = 0) -> dict:
    """GPU 0's samples as a runner sends them (one column per field)."""
    n = len(used)
    return {
        "line": list(range(first_line, first_line + n)),
        "t": [t0 + i for i in range(n)],
        "gpu": [0] * n,
        "used_bytes": used,
        "total_bytes": [TOTAL] * n,
        "name": ["Stand-in 80G"] * n,
    }


def post(server, job: int, auth: dict, batch: dict) -> None:
    r = server.api.post(f"/api/jobs/{job}/telemetry", json=batch, headers=auth)
    assert r.status_code == 200, r.text


def test_two_nodes_same_gpu_index_and_lines(two_node_job, page):
    server, job, auth, hooked = two_node_job
    t0 = time.time() - 30
    calm = [10 * GIB + i * 1024 for i in range(N)]
    near_oom = [int(TOTAL * (0.96 + i / 1000)) for i in range(N)]  # sustained above 95%
    a = {"seq": 0, "node": "node-a", "memory": memory(t0, calm)}
    b = {"seq": 0, "node": "node-b", "memory": memory(t0 + 0.5, near_oom)}
    post(server, job, auth, a)
    post(server, job, auth, b)
    # Resends (the same lines again, from either node) change nothing.
    post(server, job, auth, {**b, "seq": 1})
    post(server, job, auth, a)

    page_ = server.api.get(f"/api/jobs/{job}/memory", params={"limit": 1000}).json()
    assert len(page_["samples"]) == 2 * N
    assert [(g["node"], g["gpu"]) for g in page_["gpus"]] == [("node-a", 0), ("node-b", 0)]
    by_node = {}
    for s in page_["samples"]:
        by_node.setdefault((s["node"], s["gpu"]), []).append(s["used_bytes"])
    assert by_node == {("node-a", 0): calm, ("node-b", 0): near_oom}

    only_b = server.api.get(f"/api/jobs/{job}/memory", params={"node": "node-b"}).json()
    assert {s["node"] for s in only_b["samples"]} == {"node-b"} and len(only_b["samples"]) == N
    chart = server.api.get(f"/api/jobs/{job}/memory", params={"max_points": 100}).json()
    assert sorted({(s["node"], s["used_bytes"]) for s in chart["samples"]}) == sorted(
        {("node-a", u) for u in calm} | {("node-b", u) for u in near_oom}
    )  # the chart tiles keep the two series apart
    bad = server.api.get(f"/api/jobs/{job}/memory", params={"node": "a b"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "node"]
    refused = server.api.post(
        f"/api/jobs/{job}/telemetry", json={"seq": 2, "node": "no/slash", "memory": []}, headers=auth
    )
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "node"

    def near() -> list:
        found = server.api.get(f"/api/jobs/{job}/alerts").json()
        return [x for x in found if x["kind"] == "vram_near_oom"]

    (alert,) = until(near, "near-OOM alert")
    assert alert["node"] == "node-b" and alert["gpu"] == 0
    assert alert["message"].startswith("node-b GPU 0:") and "node-a" not in alert["message"]
    (sent,) = until(lambda: [x for x in hooked if x.get("kind") == "vram_near_oom"], "the alert's webhook")
    assert sent["node"] == "node-b" and "vram_near_oom on node-b GPU 0:" in sent["text"]

    used_by_node = {
        (x.labels["node"], x.labels["gpu"]): x.value
        for fam in text_string_to_metric_families(server.api.get("/metrics").text)
        for x in fam.samples
        if x.name == "tunedeck_job_vram_used_bytes" and x.labels["job_id"] == str(job)
    }
    assert used_by_node == {("node-a", "0"): calm[-1], ("node-b", "0"): near_oom[-1]}

    page.goto(f"{server.url}/jobs/{job}")

    def legend() -> list[str]:
        names = page.evaluate("(document.getElementById('mem-chart').data || []).map((t) => t.name || '')")
        return [n for n in names if n.endswith(" used")]

    names = until(lambda: len(legend()) == 2 and legend(), "two memory traces")
    assert names == ["node-a · GPU 0 Stand-in 80G used", "node-b · GPU 0 Stand-in 80G used"]
    item = page.locator('.alert-item[data-kind="vram_near_oom"]')
    item.wait_for(timeout=120_000)
    assert "vram_near_oom · node-b · GPU 0" in item.inner_text()
    shot(page, "job-memory-two-nodes")
    assert page.errors == []


def test_a_runner_names_its_node_once_per_batch(tmp_path):
    from tunedeck.runner.report import Reporter, merge

    # Nothing listens on port 9: the batch stays in the outbox, which is what the server would replay.
    rep = Reporter(
        url="http://127.0.0.1:9", job_id=1, token="t", run_dir=tmp_path, retry_max_s=1, node="node-b"
    )
    try:
        rep.add(memory=[{"line": 0, "t": 1.0, "gpu": 0, "used_bytes": 5}])
        rep.add(memory=[{"line": 1, "t": 2.0, "gpu": 0, "used_bytes": 6}])
    finally:
        rep.close()
    sent = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [b["node"] for b in sent] == ["node-b", "node-b"]
    assert "node" not in sent[0]["memory"]  # once per batch, not per sample
    assert merge(sent)["node"] == "node-b" and merge(sent)["memory"]["line"] == [0, 1]


def test_analyze_reads_a_node_column(tmp_path):
    from tunedeck.alerts import Series, analyze
    from tunedeck.alerts.rundir import parse_memory_csv

    rows = ["t,gpu,used_bytes,total_bytes,node"]
    for i in range(N):
        rows += [f"{i},0,{10 * GIB},{TOTAL},node-a", f"{i},0,{int(TOTAL * 0.97)},{TOTAL},node-b"]
    memory = parse_memory_csv("\n".join(rows))
    assert set(memory) == {("node-a", 0), ("node-b", 0)}
    near = [f for f in analyze(Series(memory=memory, devices=[0])) if f.kind == "vram_near_oom"]
    assert [(f.node, f.gpu) for f in near] == [("node-b", 0)]
    assert near[0].message.startswith("node-b GPU 0:") and near[0].as_dict()["node"] == "node-b"
    one = {k: v for k, v in memory.items() if k[0] == "node-b"}  # one node: named in data, not in words
    (alone,) = [f for f in analyze(Series(memory=one, devices=[0])) if f.kind == "vram_near_oom"]
    assert alone.node == "node-b" and alone.message.startswith("GPU 0:")

"""The hardware readings carried end to end: the real sampler over the stand-in `amdsmi` (MI300X in
CPX/NPS4 and an MI250X card's two GCDs), its samples packed as a runner packs them and posted to the
app, then read back from the job's memory API and `/metrics` (parsed with prometheus_client's parser,
names held to Prometheus's conventions); and `/api/nodes` of a real server over the stand-in."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.telemetry.test_backends import FAKES, per_gpu, run_sampler
from tests.telemetry.test_generations import GCD0, GCD1, MI300X, XGMI_READ_PER_S, XGMI_WRITE_PER_S
from tests.test_ingest_columns import new_job
from tests.test_ingest_wire import PACKED, post
from tests.utils.servers import ROOT
from tests.utils.wait import until
from tunedeck.contract import wire
from tunedeck.contract.protocol import node_name
from tunedeck.runner import report

GiB = 1024**3


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    a = App(tmp_path_factory.mktemp("carried") / "ws", assets).start()
    yield a
    a.stop()


def scrape(app) -> dict[str, list[tuple[dict, float]]]:
    r = app.api.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_readings_go_from_the_sampler_to_the_memory_api_and_metrics(app, assets, tmp_path):
    out = run_sampler(tmp_path, FAKES, [MI300X, GCD0, GCD1], visible=[0, 1, 2])
    rows = [s for g in per_gpu(out).values() for s in g]
    job_id = new_job(app, assets, "on an MI300X and an MI250X")
    host = node_name(platform.node())  # as a runner names its node
    r = post(app, job_id, wire.encode({"seq": 0, "node": host, "memory": report.columns(rows)}), PACKED)
    assert r.status_code == 200, r.text
    # The MI300X's uncorrectable errors rose during the job: a critical alert naming GPU, node, block.
    (ecc,) = until(
        lambda: [
            a
            for a in app.api.get(f"/api/jobs/{job_id}/alerts").json()
            if a["kind"] == "gpu_ecc_uncorrectable"
        ],
        "the ECC alert",
    )
    assert ecc["severity"] == "critical" and ecc["gpu"] == 0 and ecc["node"] == host
    assert (
        ecc["message"] == f"GPU 0 on {host}: 2 uncorrectable ECC error(s) during the job (0 → 2) in UMC (2)"
    )

    page = app.api.get(f"/api/jobs/{job_id}/memory", params={"limit": 20000}).json()
    by = {}
    for s in page["samples"]:
        by.setdefault(s["gpu"], []).append(s)
    assert {s["temp_c"] for s in by[0]} == {None}  # MI300X: no edge sensor, and the chart still has
    assert {s["temp_junction_c"] for s in by[0]} == {84} and {s["temp_hbm_c"] for s in by[0]} == {76}
    assert 0.25 in {s["throttle_power"] for s in by[0]} and by[0][-1]["ecc_uncorrectable"] == 2
    assert [s["ecc_blocks"] for s in by[0] if s["ecc_blocks"]] == ["GFX=1/0,UMC=5/2"]
    assert {s["power_w"] for s in by[2]} == {None} and {s["power_shared_with"] for s in by[2]} == {1}
    # xGMI: the MI300X's cumulative counters, growing sample to sample; none on the MI250X's GCDs.
    xr = [s["xgmi_read_bytes"] for s in by[0]]
    assert None not in xr and xr == sorted(xr) and xr[-1] > xr[0] and xr[-1] % XGMI_READ_PER_S == 0
    assert {s["xgmi_read_bytes"] for s in by[1] + by[2]} == {None}
    gpus = {g["gpu"]: g for g in page["gpus"]}
    assert gpus[0]["partition"] == "CPX/NPS4" and gpus[0]["serial"] == "PCB-MI300X-0007"
    assert gpus[0]["uuid"] == MI300X["uuid"] and gpus[0]["power_shared_with"] is None
    assert gpus[2]["power_shared_with"] == 1 and gpus[1]["serial"] == gpus[2]["serial"]

    found = scrape(app)
    me = {"job_id": str(job_id)}

    def value(name: str, **labels: str) -> float:
        hits = [
            v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in {**me, **labels}.items())
        ]
        assert len(hits) == 1, (name, labels, found.get(name))
        return hits[0]

    assert value("tunedeck_job_gpu_temperature_celsius", gpu="0", sensor="junction") == 84
    assert value("tunedeck_job_gpu_temperature_celsius", gpu="0", sensor="hbm") == 76
    assert not [
        lab
        for lab, _ in found["tunedeck_job_gpu_temperature_celsius"]
        if lab["gpu"] == "0" and lab["sensor"] == "edge" and lab["job_id"] == str(job_id)
    ]
    assert value("tunedeck_job_gpu_power_watts", gpu="0") == 655
    assert value("tunedeck_job_gpu_power_watts", gpu="1") == 412
    assert not [
        lab
        for lab, _ in found["tunedeck_job_gpu_power_watts"]
        if lab["gpu"] == "2" and lab["job_id"] == str(job_id)
    ]
    assert value("tunedeck_job_gpu_power_shared_info", gpu="2", shared_with="1") == 1
    assert value("tunedeck_job_gpu_ecc_errors_total", gpu="0", type="uncorrectable") == 2
    assert value("tunedeck_job_gpu_throttle_ratio", gpu="0", reason="power") == 0.25
    assert value("tunedeck_job_gpu_clock_hertz", gpu="0") == 2100e6
    # A counter family, `_total`, by direction; a part without the counters has no series.
    assert value("tunedeck_job_gpu_xgmi_bytes_total", gpu="0", direction="read") == xr[-1]
    assert (
        value("tunedeck_job_gpu_xgmi_bytes_total", gpu="0", direction="write")
        == by[0][-1]["xgmi_write_bytes"]
    )
    assert not [
        lab
        for lab, _ in found["tunedeck_job_gpu_xgmi_bytes_total"]
        if lab["gpu"] != "0" and lab["job_id"] == str(job_id)
    ]
    assert value("tunedeck_job_gpu_utilization_ratio", gpu="0") == 0.99
    info = value(
        "tunedeck_job_gpu_info",
        gpu="0",
        hostname=host,
        gpu_id="0",
        serial_number="PCB-MI300X-0007",
        gpu_uuid=MI300X["uuid"],
        card_model="AMD Instinct MI300X",
        gpu_compute_partition_type="CPX",
        gpu_memory_partition_type="NPS4",
        Hostname=host,
        UUID=MI300X["uuid"],
        modelName="AMD Instinct MI300X",
    )
    assert info == 1
    # Prometheus's conventions: base units in the name, ratios 0..1, snake_case tunedeck_ names.
    for name in found:
        if name.startswith("tunedeck_job_gpu_"):
            assert re.fullmatch(
                r"tunedeck_job_gpu_([a-z_]+_)?(celsius|watts|hertz|ratio|total|info)", name
            ), name
    for lab, v in found["tunedeck_job_gpu_throttle_ratio"] + found["tunedeck_job_gpu_utilization_ratio"]:
        assert 0 <= v <= 1, (lab, v)


def test_nodes_api_shows_power_temperatures_ecc_throttle_and_processes(server_factory, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": [MI300X, GCD0, GCD1]}))
    server = server_factory(
        PYTHONPATH=os.pathsep.join([str(FAKES), str(ROOT / "backend")]),
        TUNEDECK_FAKE_SMI_TRACE=str(trace),
        TUNEDECK_NODES_CACHE_S="0",
    )
    server.api.get("/api/nodes")  # a first reading: throttle shares span two
    (node,) = server.api.get("/api/nodes").json()
    mi300x, gcd0, gcd1 = node["gpus"]
    assert mi300x["temp_c"] is None and mi300x["temp_junction_c"] == 84 and mi300x["temp_hbm_c"] == 76
    assert mi300x["partition"] == "CPX/NPS4" and mi300x["throttle"]["power"] == 0.25
    assert mi300x["processes"] == [
        {"pid": 4242, "name": "pt_main_thread", "vram_bytes": 30 * GiB, "job_id": None}
    ]
    assert gcd0["power_w"] == 412 and gcd1["power_w"] is None and gcd1["power_shared_with"] == 1
    assert gcd0["temp_c"] == 45 and gcd0["serial"] == gcd1["serial"]
    assert mi300x["ecc_uncorrectable"] is not None
    # xGMI: totals and the rate between the server's last two readings (the table's clock: 1 s apart).
    assert mi300x["xgmi_read_bytes_per_s"] == XGMI_READ_PER_S
    assert mi300x["xgmi_write_bytes_per_s"] == XGMI_WRITE_PER_S
    assert mi300x["xgmi_read_bytes"] % XGMI_READ_PER_S == 0 and mi300x["xgmi_read_bytes"] > 0
    assert gcd0["xgmi_read_bytes"] is None and gcd0["xgmi_read_bytes_per_s"] is None


def test_the_grafana_dashboard_is_its_script_and_queries_only_what_metrics_exports(app, assets, tmp_path):
    """docs/grafana/tunedeck.json is what scripts/grafana_dashboard.py writes, and every series its
    queries and filters name is one that a real scrape of a job with training and hardware readings holds."""
    r = subprocess.run(
        [sys.executable, "scripts/grafana_dashboard.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    board = json.loads((ROOT / "docs" / "grafana" / "tunedeck.json").read_text())
    targets = [t for p in board["panels"] for t in p.get("targets", [])]
    for p in board["panels"]:  # every panel asks the dashboard's chosen Prometheus, each query its own refId
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(set(refs)) == len(refs) and all(refs), p["title"]
    queries = [t["expr"] for t in targets]
    queries += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    named = set(re.findall(r"\b(?:tunedeck|process)_[a-z0-9_]+", " ".join(queries)))

    # A job with a loss, an eval loss, throughput and an MI300X's readings: every family has samples.
    out = run_sampler(tmp_path, FAKES, [MI300X], visible=[0])
    job_id = new_job(app, assets, "on the dashboard")
    host = node_name(platform.node())
    lines = [
        {"current_steps": 1, "total_steps": 10, "loss": 2.5, "throughput": 900.0},
        {"current_steps": 2, "total_steps": 10, "eval_loss": 2.4},
    ]
    metrics = [{"line": i, "t": i, "raw": json.dumps(x)} for i, x in enumerate(lines)]
    rows = [s for g in per_gpu(out).values() for s in g]
    batch = {"seq": 0, "node": host, "metrics": metrics, "memory": report.columns(rows)}
    assert post(app, job_id, wire.encode(batch), PACKED).status_code == 200
    found = until(lambda: (f := scrape(app)).get("tunedeck_job_eval_loss") and f, "the job's eval loss")
    assert len(named) >= 20 and not named - set(found), sorted(named - set(found))

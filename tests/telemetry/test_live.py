"""End to end on this CPU machine: real server, real runners, real LLaMA-Factory runs."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.utils.hardware import gpu_hardware
from tests.utils.servers import ROOT, demo_config
from tests.utils.wait import RUN_DEADLINE, until
from tunedeck.contract.protocol import node_name

# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
GiB = 1024**3
FAKES = ROOT / "tests" / "fakes"
NO_IDENTITY = {"serial": None, "uuid": None, "partition": None, "power_shared_with": None}


def wait_done(server, job_id: int) -> dict:
    return server.wait(job_id, ("succeeded", "failed", "cancelled"), timeout=RUN_DEADLINE)


def test_demo_run_memory_is_stored_downsampled_and_healthy(server_factory, assets):
    server = server_factory(TUNEDECK_MEMORY_SAMPLE_S="0.2")
    job = server.submit({"name": "healthy", "config": demo_config(assets, max_steps=24), "gpus": 0})
    job = wait_done(server, job["id"])
    assert job["status"] == "succeeded", job
    full = server.api.get(f"/api/jobs/{job['id']}/memory", params={"limit": 20000}).json()
    samples = full["samples"]
    # As many samples as the run lasted: the checks below need a dozen, and imports alone last longer.
    assert len(samples) >= 12 and not full["downsampled"]
    assert {s["gpu"] for s in samples} == {-1}  # host memory of the job's process tree
    host = node_name(platform.node())  # a runner names the host it samples, once per batch
    assert {s["node"] for s in samples} == {host}
    assert full["gpus"] == [
        {
            "node": host,
            "gpu": -1,
            "name": "host memory (job process tree)",
            "total_bytes": psutil.virtual_memory().total,
            **NO_IDENTITY,
        }
    ]
    peak = max(s["used_bytes"] for s in samples)
    assert 100 * 1024**2 < peak < psutil.virtual_memory().total  # a real process tree: torch, the model, data
    small = server.api.get(f"/api/jobs/{job['id']}/memory", params={"max_points": 5}).json()
    assert small["downsampled"] and len(small["samples"]) <= 8
    assert max(s["used_bytes"] for s in small["samples"]) == peak  # the maximum survives downsampling
    t = [s["t"] for s in samples]
    win = server.api.get(f"/api/jobs/{job['id']}/memory", params={"t0": t[5], "t1": t[9]}).json()["samples"]
    assert [s["t"] for s in win] == t[5:10]
    # Healthy: nothing but the plateau, and nothing open once the job ended.
    alerts = server.api.get(f"/api/jobs/{job['id']}/alerts").json()
    assert {a["kind"] for a in alerts} <= {"vram_plateau"}, alerts
    # The engine judges the finished job right after its last batch.
    until(lambda: not server.api.get("/api/alerts", params={"open": "true"}).json(), "no open alert left")
    (node,) = server.api.get("/api/nodes").json()
    if gpu_hardware():  # a CPU job on a GPU host: its series is host memory, the node lists the GPUs
        assert node["gpus"] or node["reason"], node  # or says why its SMI binding cannot read them
    else:
        assert node["backend"] == "cpu" and node["gpus"] == [] and "pyrsmi" in node["reason"]
    # The same run folder read from outside: `tunedeck analyze` over the real trainer_log.jsonl.
    csv = Path(job["run_dir"]) / "memory.csv"
    csv.write_text(
        "t,gpu,used_bytes,total_bytes\n"
        + "".join(f"{s['t']},{s['gpu']},{s['used_bytes']},{s['total_bytes']}\n" for s in samples)
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunedeck.cli.main",
            "analyze",
            job["output_dir"],
            "--memory",
            str(csv),
            "--config",
            str(Path(job["run_dir"]) / "train.yaml"),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert {f["kind"] for f in json.loads(r.stdout)} <= {"vram_plateau"}


def test_out_of_memory_run_fails_with_that_cause_and_an_oom_alert(server_factory, assets):
    # A real LLaMA-Factory run under an address-space limit it cannot live with.
    server = server_factory(TUNEDECK_TRAINER_RLIMIT_AS_BYTES=str(1200 * 1024**2))
    job = server.submit({"name": "too big", "config": demo_config(assets), "gpus": 0})
    job = wait_done(server, job["id"])
    assert job["status"] == "failed", job
    assert job["error"].startswith("out of memory: "), job["error"]
    oom = until(  # closed once the job's end is judged
        lambda: [
            a
            for a in server.api.get(f"/api/jobs/{job['id']}/alerts").json()
            if a["kind"] == "oom" and not a["open"]
        ],
        "a closed oom alert",
    )
    assert oom[0]["severity"] == "critical"
    assert "out of memory in the trainer output" in oom[0]["message"]
    assert "TUNEDECK_TRAINER_RLIMIT_AS_BYTES" in oom[0]["suggestion"]


def test_gpu_job_samples_its_scripted_gpu_and_alerts_the_spike(server_factory, assets, tmp_path):
    """The hardware boundary replaced by the stand-in amdsmi (pyrsmi's real code runs over it); the
    training itself is a real LLaMA-Factory run on the CPU. Every step is an event: the stand-in
    advances by reads, the spike waits for a training step, and the run, which has no end of its own,
    is stopped once the spike has come back down for a few samples: as many steps as the machine's
    speed gives, never a fixed number that a loaded machine takes too long over."""
    flat = [40 * GiB + (i % 3) * 64 * 1024**2 for i in range(400)]
    for i in range(48, 50):  # two reads at +30 GiB: one or two samples of the four reads each
        flat[i] += 30 * GiB
    trace = tmp_path / "trace.json"
    # The trace is keyed to the sampler's reads, and the spike waits for training step 10: at least
    # 12 samples of baseline before it, and it lands mid-training however slow the start.
    trace.write_text(
        json.dumps(
            {
                "gate": {"at": 48, "log": "output/trainer_log.jsonl", "step": 10},
                "devices": [
                    {
                        "name": "AMD Instinct MI300X",
                        "bdf": "0000:0c:00.0",
                        "total": 192 * GiB,
                        "vram": flat,
                        "activity": 90,
                        "power": 600,
                        "temp": 60,
                    },
                    {
                        "name": "AMD Instinct MI300X",
                        "bdf": "0000:1c:00.0",
                        "total": 192 * GiB,
                        "vram": [GiB],
                        "activity": 0,
                    },
                ],
            }
        )
    )
    server = server_factory(
        PYTHONPATH=os.pathsep.join([str(FAKES), str(ROOT / "backend")]),
        TUNEDECK_FAKE_SMI_TRACE=str(trace),
        TUNEDECK_MEMORY_SAMPLE_S="0.5",
    )
    (node,) = server.api.get("/api/nodes").json()
    assert node["backend"] == "rocm" and [g["bus_id"] for g in node["gpus"]] == [
        "0000:0c:00.0",
        "0000:1c:00.0",
    ]
    endless = 10**6  # steps: the test stops the run long before any machine gets there
    job = server.submit(
        {
            "name": "on gpu0",
            "config": demo_config(assets, max_steps=endless, save_steps=endless, eval_steps=endless),
            "gpus": 1,
        }
    )
    assert Path(job["output_dir"]) == Path(job["run_dir"]) / "output"  # where the gate reads the trainer log
    server.wait(job["id"], ("running",), timeout=RUN_DEADLINE)
    (node,) = server.api.get("/api/nodes").json()
    assert [g["job_id"] for g in node["gpus"]] == [job["id"], None]

    def spike_judged() -> bool:
        """The spike's samples stored, enough baseline after them to show it fell back, and its alert."""
        used = [s["used_bytes"] for s in server.api.get(f"/api/jobs/{job['id']}/memory").json()["samples"]]
        up = [i for i, u in enumerate(used) if u >= 60 * GiB]
        alerted = any(
            a["kind"] == "vram_spike" for a in server.api.get(f"/api/jobs/{job['id']}/alerts").json()
        )
        return bool(up) and len(used) - 1 - up[-1] >= 8 and alerted

    # Imports, the gate's ten steps and a dozen samples: minutes on a loaded machine.
    until(spike_judged, "the spike's samples, eight after it and its alert", timeout=420)
    assert server.api.post(f"/api/jobs/{job['id']}/cancel").status_code == 200
    job = wait_done(server, job["id"])
    assert job["status"] == "cancelled", job
    mem = server.api.get(f"/api/jobs/{job['id']}/memory").json()
    assert {s["gpu"] for s in mem["samples"]} == {0}  # only the job's own GPU
    host = node_name(platform.node())
    assert mem["gpus"] == [
        {"node": host, "gpu": 0, "name": "AMD Instinct MI300X", "total_bytes": 192 * GiB, **NO_IDENTITY}
    ]  # a trace without serial, UUID or partition, one device a card
    assert max(s["used_bytes"] for s in mem["samples"]) == max(flat)  # the two-read peak, kept by the max
    alerts = server.api.get(f"/api/jobs/{job['id']}/alerts").json()
    spikes = [a for a in alerts if a["kind"] == "vram_spike"]
    assert len(spikes) == 1 and spikes[0]["gpu"] == 0, alerts
    # The baseline's noise phase decides the last digit; the evidence must be the scripted +30 GiB.
    assert re.search(
        r"reached 70\.\d GiB, \+(29\.9|30\.0) GiB above the 40\.\d GiB baseline", spikes[0]["message"]
    ), spikes[0]["message"]
    assert {a["kind"] for a in alerts} <= {"vram_spike", "vram_plateau"}


def test_the_runner_samples_the_gpu_it_was_given_by_bus_id(server_factory, assets, tmp_path):
    """SMI libraries can number GPUs differently (the server's and the training environment's): the
    runner gets its devices' PCI bus ids in runner.json and samples those, whatever their index there."""
    mi300x = {"name": "AMD Instinct MI300X", "bdf": "0000:0c:00.0", "total": 192 * GiB, "vram": [40 * GiB]}
    mi250x = {"name": "AMD Instinct MI250X", "bdf": "0000:1c:00.0", "total": 64 * GiB, "vram": [GiB]}
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": [mi300x, mi250x]}))
    server = server_factory(
        PYTHONPATH=os.pathsep.join([str(FAKES), str(ROOT / "backend")]),
        TUNEDECK_FAKE_SMI_TRACE=str(trace),
        TUNEDECK_MEMORY_SAMPLE_S="0.2",
    )
    (node,) = server.api.get("/api/nodes").json()  # the server has read its numbering: MI300X is 0
    assert [g["name"] for g in node["gpus"]] == ["AMD Instinct MI300X", "AMD Instinct MI250X"]
    trace.write_text(json.dumps({"devices": [mi250x, mi300x]}))  # the runner's library: MI250X is 0
    job = server.submit({"name": "by bus id", "config": demo_config(assets), "gpus": 1})
    job = wait_done(server, job["id"])
    assert job["status"] == "succeeded" and job["devices"] == [0], job
    assert json.loads((Path(job["run_dir"]) / "runner.json").read_text())["bus_ids"] == ["0000:0c:00.0"]
    mem = server.api.get(f"/api/jobs/{job['id']}/memory").json()
    assert [(g["name"], g["total_bytes"]) for g in mem["gpus"]] == [("AMD Instinct MI300X", 192 * GiB)]
    assert mem["samples"] and {s["used_bytes"] for s in mem["samples"]} == {40 * GiB}

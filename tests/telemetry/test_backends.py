"""Telemetry backends over the real binding code: pyrsmi over a stand-in `amdsmi`, NVML over a
stand-in `pynvml` (both replay a scripted trace), and the psutil backend over real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests.utils.servers import ROOT
from tests.utils.wait import until
from tunedeck.telemetry import open_backend, select
from tunedeck.telemetry.base import Reading, norm_bus_id
from tunedeck.telemetry.cpu import CpuBackend

FAKES = ROOT / "tests" / "fakes"
GiB = 1024**3
MI300X = {
    "name": "AMD Instinct MI300X",
    "bdf": "0000:0c:00.0",
    "total": 192 * GiB,
    "activity": 87,
    "power": 612.5,
    "temp": 58,
    "processes": [{"pid": 4242, "vram": 30 * GiB}],
    "vram": [v * GiB for v in (0, 10, 31, 12, 12, 40, 13, 20, 20)],
}  # 0: read by the inventory at open
MI250X = {
    "name": "AMD Instinct MI250X",
    "bdf": "0000:03:00.0",
    "total": 64 * GiB,
    "activity": 3,
    "power": 95,
    "temp": 41,
    "vram": [v * GiB for v in (0, 1, 2, 3, 4, 5, 6, 7, 8)],
}


def run_sampler(tmp_path: Path, path: Path | list[Path], devices: list[dict], visible: list[int]) -> dict:
    """A sampler in a fresh interpreter whose path starts with the stand-in folder(s)."""
    paths = path if isinstance(path, list) else [path]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": devices}))
    code = textwrap.dedent(f"""
        import json
        from tests.utils.wait import DEADLINE, until
        from tunedeck.telemetry.sampler import Sampler
        s = Sampler(interval_s=0.1, polls=2, gpus=True, visible={visible!r}).start()
        s.ready.wait(DEADLINE)
        samples = []

        def four_of_each():  # however slowly this interpreter gets scheduled
            samples.extend(s.drain())
            return min([sum(x["gpu"] == g for x in samples) for g in s.indices or [-1]]) >= 4

        until(four_of_each, "four samples of every device", interval=0.05)
        s.stop()
        from pyrsmi import rocml
        print(json.dumps({{"backend": s.backend_name, "reason": s.reason, "indices": s.indices,
                           "samples": samples + s.drain()}}))
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, paths), str(ROOT / "backend"), str(ROOT)]),
        "TUNEDECK_FAKE_SMI_TRACE": str(trace),
    }
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def per_gpu(out: dict) -> dict[int, list[dict]]:
    by: dict[int, list[dict]] = {}
    for s in out["samples"]:
        by.setdefault(s["gpu"], []).append(s)
    return by


def test_pyrsmi_real_code_path_over_stand_in_amdsmi(tmp_path):
    out = run_sampler(tmp_path, FAKES, [MI300X, MI250X], visible=[0, 1])
    assert out["backend"] == "rocm" and out["reason"] is None and out["indices"] == [0, 1]
    by = per_gpu(out)
    # Two polls per sample, each sample the larger: the 31 and 40 GiB peaks survive. The 40 GiB poll,
    # 28 GiB over the last sample, is sent at once: its interval (the MI250X's 5 GiB too) ends there.
    assert [s["used_bytes"] for s in by[0][:4]] == [31 * GiB, 12 * GiB, 40 * GiB, 20 * GiB]
    assert [s["used_bytes"] for s in by[1][:4]] == [2 * GiB, 4 * GiB, 5 * GiB, 7 * GiB]
    first = by[0][0]
    assert first["name"] == "AMD Instinct MI300X" and by[1][0]["name"] == "AMD Instinct MI250X"
    assert first["total_bytes"] == 192 * GiB and first["util"] == 87 and first["power_w"] == 612.5
    assert first["temp_c"] == 58  # from amdsmi: pyrsmi has no temperature
    lines = [s["line"] for s in out["samples"]]
    assert lines == list(range(len(lines)))  # the natural key of every sample


def test_a_rise_is_sent_at_once_but_never_twice_in_a_row(tmp_path):
    """Over 9.6 GiB (5 % of 192 GiB) above the last sample ends the interval at that poll; the interval
    after such a sample runs whole, so a climb is not sent at every poll."""
    climb = {**MI300X, "vram": [v * GiB for v in (0, 10, 10, 20, 30, 31, 31, 31, 31)]}
    out = run_sampler(tmp_path, FAKES, [climb], visible=[0])
    # 10 | 20 alone (+10 GiB) | 30 and 31 whole, though 30 rose 10 GiB too | 31
    assert [s["used_bytes"] for s in per_gpu(out)[0][:4]] == [10 * GiB, 20 * GiB, 31 * GiB, 31 * GiB]


def test_job_samples_only_its_own_gpu(tmp_path):
    out = run_sampler(tmp_path, FAKES, [MI300X, MI250X], visible=[1])
    assert {s["gpu"] for s in out["samples"]} == {1}


def test_nvml_path_over_stand_in_pynvml(tmp_path):
    # ROCm is tried first: on a ROCm host its real library would answer, so this host has none.
    no_rocm = tmp_path / "no-rocm"
    (no_rocm / "amdsmi").mkdir(parents=True)
    (no_rocm / "amdsmi" / "__init__.py").write_text(
        "raise ImportError('no ROCm on this stand-in NVIDIA host')\n"
    )
    out = run_sampler(tmp_path, [no_rocm, FAKES / "nvml"], [MI300X], visible=[0])
    assert out["backend"] == "nvidia"
    s = per_gpu(out)[0]
    assert [x["used_bytes"] for x in s[:2]] == [31 * GiB, 12 * GiB]
    assert s[0]["power_w"] == 612.5 and s[0]["temp_c"] == 58 and s[0]["total_bytes"] == 192 * GiB


def test_absent_and_broken_libraries_mean_no_gpu(tmp_path):
    broken = tmp_path / "broken"
    (broken / "amdsmi").mkdir(parents=True)
    # What the PyPI amdsmi wheel does without ROCm: a KeyError at import, not an ImportError.
    (broken / "amdsmi" / "__init__.py").write_text("raise KeyError('libamd_smi.so')\n")
    (broken / "pynvml.py").write_text(
        "class NVMLError_LibraryNotFound(Exception):\n    pass\n"
        "def nvmlInit():\n    raise NVMLError_LibraryNotFound('libnvidia-ml.so.1')\n"
    )
    code = (
        "from tunedeck.telemetry import open_backend; b, r = open_backend(); print(b.name); print(r);"
        "print(b.read()[0].used_bytes > 0)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), str(ROOT / "backend")])}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    name, reason, ok = r.stdout.strip().splitlines()
    assert name == "cpu" and ok == "True"
    assert "pyrsmi" in reason and "pynvml" in reason and "NVMLError_LibraryNotFound" in reason


def test_bus_id_matching_beats_index_order():
    readings = [Reading(0, "a", 1, bus_id="0000:0c:00.0"), Reading(1, "b", 1, bus_id="0000:03:00.0")]
    assert select(readings, visible=[0], bus_ids=[norm_bus_id("0000:03:00.0")]) == [1]
    assert select(readings, visible=[0]) == [0]
    assert norm_bus_id("00000000:0C:00.0") == norm_bus_id("0c:00.0") == "0000:0c:00.0"
    assert norm_bus_id((0 << 32) | (0x0C << 8) | (0 << 3) | 0) == "0000:0c:00.0"


def test_cpu_backend_counts_the_whole_process_tree():
    # A child that starts a grandchild holding ~200 MB: the tree's RSS must include it. Their sleeps
    # only keep them alive while the test reads them; the test kills both.
    code = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
        "'b = bytearray(200 * 1024 * 1024); import time; print(1, flush=True); time.sleep(30)'], "
        "stdout=subprocess.PIPE); p.stdout.readline(); print(1, flush=True); time.sleep(30)"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        root.stdout.readline()
        backend = CpuBackend(root.pid)
        (r,) = backend.read()
        assert r.index == -1 and r.total_bytes == psutil.virtual_memory().total
        assert r.used_bytes >= 200 * 1024 * 1024
        assert len(r.pids) == 2
    finally:
        for p in psutil.Process(root.pid).children(recursive=True):
            p.kill()
        root.kill()
        root.wait()


def test_open_backend_without_gpus_is_cpu():
    backend, reason = open_backend(gpus=False, root_pid=os.getpid())
    assert backend.name == "cpu" and reason
    assert backend.read()[0].used_bytes > 0


def test_cpu_backend_reads_nothing_once_the_tree_has_exited():
    # A finished trainer is no memory at all, not a last sample of 0 B (a drop that reads as a crash):
    # neither while it is a zombie nor once it is reaped.
    root = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        backend = CpuBackend(root.pid)
        (r,) = backend.read()
        assert r.used_bytes > 0 and list(r.pids) == [root.pid]
        root.stdin.close()
        until(lambda: psutil.Process(root.pid).status() == psutil.STATUS_ZOMBIE, "the child to exit")
        assert backend.read() == []
    finally:
        root.kill()
        root.wait()
    assert backend.read() == []
    assert CpuBackend(root.pid).read() == []  # a tree found empty from the start

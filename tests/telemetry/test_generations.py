"""What each AMD generation answers, through pyrsmi's and our real code over the stand-in `amdsmi`
(tests/fakes/amdsmi), and NVML's extra readings over the stand-in `pynvml`: MI250X's two GCDs a card
with the power on one die, MI300X's missing edge sensor, junction/HBM temperatures, partition modes,
throttle residency, ECC and xGMI traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.telemetry.test_backends import FAKES, per_gpu, run_sampler
from tests.utils.servers import ROOT

GiB = 1024**3
# One MI250X card: two GCDs enumerated as two GPUs, one board serial; the card's power on GCD 0 only.
GCD0 = {
    "gen": "MI250X",
    "name": "AMD Instinct MI250X",
    "bdf": "0000:29:00.0",
    "serial": "PCB-MI250X-0042",
    "uuid": "b9ff74a1-0000-1000-80fa-0f0b8e4c3a11",
    "total": 64 * GiB,
    "activity": 91,
    "power": 412,
    "temp": 45,
    "temp_junction": 63,
    "temp_hbm": [71],
    "clock": 1700,
    "vram": [v * GiB for v in (0, 20, 21, 22, 23, 24, 25, 26, 27)],
}
GCD1 = {
    **GCD0,
    "bdf": "0000:2c:00.0",
    "uuid": "b9ff74a1-0000-1000-80fa-0f0b8e4c3a12",
    "power": None,  # N/A on the secondary die
    "temp": 44,
    "temp_junction": 60,
    "temp_hbm": [69],
}
MI300X = {
    "gen": "MI300X",
    "name": "AMD Instinct MI300X",
    "bdf": "0000:05:00.0",
    "serial": "PCB-MI300X-0007",
    "uuid": "13ff74a1-0000-1000-8000-7cfd2cfd2c00",
    "total": 192 * GiB,
    "activity": 99,
    "power": 655,
    "temp_junction": 84,
    "temp_hbm": [72, 76, 74, 73],
    "clock": 2100,
    "partition": ["CPX", "NPS4"],
    "throttle": {"power": 0.25, "hbm_thermal": 0.1},
    # ECC by the device's memory reads: two uncorrectable UMC errors land at the seventh read (a
    # sampler's third sample of two polls), after the job's first samples saw none
    "ecc": [{}] * 6 + [{"UMC": [5, 2], "GFX": [1, 0]}],
    "processes": [{"pid": 4242, "vram": 30 * GiB, "name": "pt_main_thread"}],
    # xGMI: eight links, link 0 idle (as in AMD's exporter's MI300X example), the seven to the other
    # GPUs of the platform each 1 MiB read and 0.5 MiB written a metrics read (a second of device time)
    "xgmi": {"read": [0, *[1024] * 7], "write": [0, *[512] * 7]},
    "vram": [v * GiB for v in (0, 10, 11, 12, 13, 14, 15, 16, 17)],
}
MiB = 1024**2
XGMI_READ_PER_S, XGMI_WRITE_PER_S = 7 * MiB, 3.5 * MiB

READ = textwrap.dedent("""
    import json, amdsmi
    from pyrsmi import rocml
    from tunedeck.telemetry.base import node_fields
    from tunedeck.telemetry.rocm import RocmBackend
    b = RocmBackend()
    b.open()
    first = b.read()
    second = b.read()
    before = {r.index: r for r in first}
    print(json.dumps({
        "nodes": [node_fields(r, before[r.index]) for r in second],
        "pyrsmi_power": [rocml.smi_get_device_average_power(i) for i in range(len(second))],
    }))
    b.close()
""")


def read_twice(tmp_path: Path, devices: list[dict]) -> dict:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"devices": devices}))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKES), str(ROOT / "backend"), str(ROOT)]),
        "TUNEDECK_FAKE_SMI_TRACE": str(trace),
    }
    r = subprocess.run(
        [sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_mi250x_card_power_is_on_one_gcd_and_said_so_on_the_other(tmp_path):
    out = read_twice(tmp_path, [GCD0, GCD1])
    gcd0, gcd1 = out["nodes"]
    # The primary die reports the whole card; the secondary says whose reading covers it: no sum, no drop.
    assert gcd0["power_w"] == 412 and gcd0["power_shared_with"] is None
    assert gcd1["power_w"] is None and gcd1["power_shared_with"] == 0
    # pyrsmi 1.1 compares amdsmi's "N/A" (current_socket_power, MI300+ only) with 0: -1 on both dies.
    assert out["pyrsmi_power"] == [-1, -1]
    # Edge, junction and memory sensors all answer on MI200; residency counters do not (MI3xx only).
    assert (gcd0["temp_c"], gcd0["temp_junction_c"], gcd0["temp_hbm_c"]) == (45, 63, 71)
    assert gcd1["temp_c"] == 44 and gcd0["throttle"] == {} and gcd0["clock_mhz"] == 1700
    assert gcd0["partition"] is None and gcd0["serial"] == gcd1["serial"] == "PCB-MI250X-0042"


def test_mi300x_has_no_edge_sensor_and_reads_junction_hbm_throttle_partition_ecc(tmp_path):
    out = read_twice(tmp_path, [MI300X])
    (g,) = out["nodes"]
    assert g["temp_c"] is None  # no edge sensor on MI300: the temperature comes from junction and HBM
    assert g["temp_junction_c"] == 84 and g["temp_hbm_c"] == 76  # the hottest of four stacks
    assert g["power_w"] == 655 and out["pyrsmi_power"] == [655.0]  # current socket power (average: N/A)
    assert g["partition"] == "CPX/NPS4" and g["clock_mhz"] == 2100
    # Shares from the cumulative counters between the two reads, not amdsmi_get_violation_status
    # (the stand-in refuses it: it sleeps 100 ms inside every call).
    assert g["throttle"] == {"power": 0.25, "thermal": 0.0, "hbm_thermal": 0.1}
    # Two memory reads so far: the ECC errors scripted for the seventh are not there yet.
    assert g["ecc_correctable"] == 0 and g["ecc_uncorrectable"] == 0 and g["ecc_blocks"] == {}
    assert g["processes"] == [{"pid": 4242, "name": "pt_main_thread", "vram_bytes": 30 * GiB}]
    assert g["uuid"] == MI300X["uuid"]


def test_samples_carry_the_readings_and_say_identity_and_ecc_blocks_on_change(tmp_path):
    out = run_sampler(tmp_path, FAKES, [MI300X, GCD0, GCD1], visible=[0, 1, 2])
    by = per_gpu(out)
    mi300x, gcd0, gcd1 = by[0], by[1], by[2]
    first = mi300x[0]
    assert first["temp_c"] is None and first["temp_junction_c"] == 84 and first["temp_hbm_c"] == 76
    assert first["serial"] == "PCB-MI300X-0007" and first["partition"] == "CPX/NPS4"
    assert first["throttle_power"] is None  # a share needs two readings
    assert all("serial" not in s and "uuid" not in s for s in mi300x[1:3])  # said once
    assert mi300x[1]["throttle_power"] == 0.25 and mi300x[1]["throttle_hbm"] == 0.1
    assert mi300x[1]["throttle_thermal"] == 0.0
    # The UMC errors arrive at a later read: the counts rise and the blocks are said when they change.
    assert mi300x[-1]["ecc_uncorrectable"] == 2 and mi300x[-1]["ecc_correctable"] == 6
    said = [s["ecc_blocks"] for s in mi300x if "ecc_blocks" in s]
    assert said == ["GFX=1/0,UMC=5/2"]
    assert {s["power_w"] for s in gcd0} == {412} and {s["power_shared_with"] for s in gcd0} == {None}
    assert {s["power_w"] for s in gcd1} == {None} and {s["power_shared_with"] for s in gcd1} == {
        1
    }  # GPU 1: GCD0
    assert gcd0[0]["temp_c"] == 45 and gcd0[0]["throttle_power"] is None


def test_nvml_reads_ecc_throttle_clock_and_identity(tmp_path):
    no_rocm = tmp_path / "no-rocm"
    (no_rocm / "amdsmi").mkdir(parents=True)
    (no_rocm / "amdsmi" / "__init__.py").write_text("raise ImportError('no ROCm on this NVIDIA host')\n")
    h100 = {
        "name": "NVIDIA H100 80GB HBM3",
        "bdf": "0000:18:00.0",
        "total": 80 * GiB,
        "activity": 97,
        "power": 690.5,
        "temp": 71,
        "clock": 1980,
        "uuid": "GPU-5b3b48fd-407b-f51c-705c-e77fa81fe6f0",
        "serial": "1654922006536",
        "throttle": {"power": 0.5, "thermal": 0.0},
        "ecc": {"DRAM": [3, 1]},
        "vram": [v * GiB for v in (0, 10, 11, 12, 13, 14, 15, 16, 17)],
    }
    out = run_sampler(tmp_path, [no_rocm, FAKES / "nvml"], [h100], visible=[0])
    assert out["backend"] == "nvidia"
    s = per_gpu(out)[0]
    assert s[0]["uuid"] == h100["uuid"] and s[0]["serial"] == h100["serial"]
    assert s[0]["ecc_correctable"] == 3 and s[0]["ecc_uncorrectable"] == 1
    assert s[0]["clock_mhz"] == 1980 and s[0]["power_w"] == 690.5 and s[0]["temp_c"] == 71
    assert s[1]["throttle_power"] == 0.5 and s[1]["throttle_thermal"] == 0.0


def test_xgmi_traffic_sums_the_links_that_answer_and_a_reload_gives_no_rate(tmp_path):
    # The same MI300X three ways: all eight links answering, some links "N/A" (amdsmi's answer for an
    # entry the driver did not fill), and a driver reload between the two readings; beside an MI250X
    # GCD, whose metrics table (gpu_metrics v1_3) has no xGMI counters at all.
    gaps = {**MI300X, "bdf": "0000:06:00.0", "serial": "PCB-MI300X-0008"}
    gaps["xgmi"] = {"read": [None, 1024, None, 1024], "write": [None] * 8}
    reloaded = {**MI300X, "bdf": "0000:07:00.0", "serial": "PCB-MI300X-0009", "xgmi_reload": 1}
    out = read_twice(tmp_path, [MI300X, gaps, reloaded, GCD0])
    full, partial, reload, mi250x = out["nodes"]
    # Two metrics reads: the counters hold two reads' growth, summed over the links, KB -> bytes.
    assert full["xgmi_read_bytes"] == 2 * XGMI_READ_PER_S and full["xgmi_write_bytes"] == 2 * XGMI_WRITE_PER_S
    # The rate over the table's own clock (the driver's timestamp: one second apart here).
    assert full["xgmi_read_bytes_per_s"] == XGMI_READ_PER_S
    assert full["xgmi_write_bytes_per_s"] == XGMI_WRITE_PER_S
    # "N/A" links are skipped, not read as 0 and not failing the sum; a direction no link answers is
    # no reading at all (None), never 0 bytes.
    assert partial["xgmi_read_bytes"] == 2 * 2 * MiB and partial["xgmi_read_bytes_per_s"] == 2 * MiB
    assert partial["xgmi_write_bytes"] is None and partial["xgmi_write_bytes_per_s"] is None
    # A counter that went back (the driver reloaded) gives no rate, in either direction.
    assert reload["xgmi_read_bytes"] == 0 and reload["xgmi_read_bytes_per_s"] is None
    assert reload["xgmi_write_bytes_per_s"] is None
    assert mi250x["xgmi_read_bytes"] is None and mi250x["xgmi_read_bytes_per_s"] is None


def test_xgmi_rates_and_link_sums_by_rule():
    from tunedeck.telemetry.base import Reading, xgmi_rates
    from tunedeck.telemetry.rocm import link_bytes
    from tunedeck.telemetry.sampler import newest_counters, sample_fields

    assert link_bytes([0, 3, "N/A", 5]) == 8 * 1024 and link_bytes([0] * 8) == 0
    assert link_bytes("N/A") is None and link_bytes(["N/A"] * 8) is None and link_bytes(None) is None

    def at(clock, read, write=None):
        return Reading(0, "x", 0, xgmi_clock=clock, xgmi_read_bytes=read, xgmi_write_bytes=write)

    assert xgmi_rates(at(12.0, 3000, 500), at(10.0, 1000, 100)) == {"read": 1000.0, "write": 200.0}
    assert xgmi_rates(at(12.0, 3000, 50), at(10.0, 1000, 100)) == {"read": 1000.0}  # write went back
    assert xgmi_rates(at(10.0, 3000), at(10.0, 1000)) == {}  # no time between them
    assert xgmi_rates(at(12.0, 3000), None) == {} and xgmi_rates(at(None, 3000), at(10.0, 1)) == {}
    # A sample keeps the poll that saw the most memory, and the newest poll's counters (it is dated then).
    kept, newest = at(10.0, 1000, 10), at(11.0, 2000, 20)
    newest_counters(kept, newest)
    assert sample_fields(kept, None)["xgmi_read_bytes"] == 2000 and kept.xgmi_clock == 11.0

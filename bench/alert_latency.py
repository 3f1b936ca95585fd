"""Time from a VRAM spike to its alert in the API, end to end on this machine.

    TUNEDECK_TEST_ASSETS=/tmp/tdassets python bench/alert_latency.py

A real server and a real LLaMA-Factory run (CPU) on "GPU 0" of the stand-in amdsmi, which replays
a flat 40 GiB line with 0.5 s spikes of +30 GiB at known wall-clock times. The script polls
GET /api/jobs/{id}/alerts every 50 ms and prints, per spike, the seconds from the spike's start
to the moment the API shows it, and when the sample holding the spike was stored. The path: sampler
interval (max of 4 polls; the runner sends each sample as it is taken), ingest commit, alert engine
(TUNEDECK_ALERT_INTERVAL_S), and the one sample after the peak that confirms it came back down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.conftest import PYTHON, Server, demo_config

GiB = 1024**3


def main() -> None:
    sample_s = float(os.environ.get("SAMPLE_S", "1.0"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        assets = Path(os.environ.get("TUNEDECK_TEST_ASSETS", tmp / "assets"))
        subprocess.run(
            [PYTHON, "-m", "tunedeck.demo", "build", "--workspace", str(assets)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        dt, start = 0.25, time.time() + 3
        vram = [40 * GiB] * 400
        spikes = [14.0, 22.0, 31.0]  # seconds after the trace start
        for s in spikes:
            for k in range(int(s / dt), int((s + 0.5) / dt)):
                vram[k] = 70 * GiB
        trace = tmp / "trace.json"
        trace.write_text(
            json.dumps(
                {
                    "mode": "time",
                    "start": start,
                    "dt": dt,
                    "devices": [
                        {
                            "name": "AMD Instinct MI300X",
                            "bdf": "0000:0c:00.0",
                            "total": 192 * GiB,
                            "vram": vram,
                        }
                    ],
                }
            )
        )
        server = Server(
            tmp / "ws",
            assets,
            PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "fakes"), str(ROOT / "backend")]),
            TUNEDECK_FAKE_SMI_TRACE=str(trace),
            TUNEDECK_MEMORY_SAMPLE_S=str(sample_s),
        ).start()
        try:
            time.sleep(max(0.0, start - time.time()))
            job = server.submit(
                {
                    "name": "latency",
                    "config": demo_config(assets, max_steps=400, save_steps=1000, eval_steps=1000),
                    "gpus": 1,
                }
            )
            seen: dict[int, float] = {}
            stored: dict[int, float] = {}  # the first sample holding the spike, visible in the API
            last = (None, 0)
            while len(seen) < len(spikes) and time.time() < start + spikes[-1] + 30:
                rows = [
                    a
                    for a in server.api.get(f"/api/jobs/{job['id']}/alerts").json()
                    if a["kind"] == "vram_spike"
                ]
                now = time.time()
                high = [
                    m["t"]
                    for m in server.api.get(
                        f"/api/jobs/{job['id']}/memory", params={"t0": start, "limit": 20000}
                    ).json()["samples"]
                    if m["used_bytes"] >= 60 * GiB
                ]
                for t in high:
                    stored.setdefault(min(range(len(spikes)), key=lambda i: abs(start + spikes[i] - t)), now)
                if rows and (rows[-1]["t"], rows[-1]["count"]) != last:
                    last = (rows[-1]["t"], rows[-1]["count"])
                    k = min(range(len(spikes)), key=lambda i: abs(start + spikes[i] - rows[-1]["t"]))
                    seen.setdefault(k, now)
                time.sleep(0.05)
            server.api.post(f"/api/jobs/{job['id']}/cancel")
            print(f"sample interval {sample_s:g} s (max of 4 polls), alert interval 1 s")
            for k, s in enumerate(spikes):
                got, kept = seen.get(k), stored.get(k)
                print(
                    f"spike {k + 1} at +{s:.0f} s: "
                    + (
                        f"its sample stored after {kept - (start + s):.2f} s, "
                        if kept
                        else "no sample stored, "
                    )
                    + (f"alert after {got - (start + s):.2f} s" if got else "missed")
                )
            server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=120)
        finally:
            server.stop()


if __name__ == "__main__":
    main()

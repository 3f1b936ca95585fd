"""Time from a VRAM spike to its alert in the API and on the job page, end to end on this machine.

    TUNEDECK_TEST_ASSETS=/tmp/tdassets python bench/alert_latency.py    (SAMPLE_S=1.0 by default)

A real server and a real LLaMA-Factory run (CPU) on "GPU 0" of the stand-in amdsmi, which replays
a flat 40 GiB line with one-poll spikes of +30 GiB at known read numbers (the stand-in is keyed to
reads, 4 a sample interval) and logs the wall-clock time of each read. The script polls
GET /api/jobs/{id}/alerts every 50 ms and prints, per spike, the seconds from the first read that
saw it to the moment the API shows its alert (a real spike may begin up to one poll, a quarter of
the interval, before that read), and the same to the moment an open job page (headless Chromium,
PAGE=0 to skip) shows it. The path: the rest of the sampler interval holding the spike (the sample is
the max of its polls, sent when the interval ends), the ingest commit, the alert engine's pass (it
alerts on the sample that rose), and the read, or the stream's push to the page. So the floor is up
to one sample interval.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.utils.browser import ARGS, CHROMIUM
from tests.utils.servers import PYTHON, Server, demo_config

GiB = 1024**3
# On the page: each time the alert list is drawn, what it shows, with the wall-clock time.
OBSERVE = """() => {
  window.shownAlerts = [];
  const note = () => {
    for (const a of window.tunedeck.alerts) window.shownAlerts.push([Date.now() / 1000, a.kind, a.t, a.count]);
  };
  new MutationObserver(note).observe(document.querySelector("#alerts"), { childList: true, subtree: true });
}"""


def main() -> None:
    sample_s = float(os.environ.get("SAMPLE_S", "1.0"))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        assets = Path(os.environ.get("TUNEDECK_TEST_ASSETS", tmp / "assets"))
        subprocess.run(
            [PYTHON, "-m", "tunedeck_train.demo", "build", "--workspace", str(assets)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        polls = 4 / sample_s  # reads a second: the sampler takes 4 polls an interval
        # Seconds of sampling after its first read; each spike one poll long, at each poll of an
        # interval in turn (a longer one can straddle two samples, and then the confirming sample
        # is one interval later).
        spikes = [14.0, 22.25, 31.5, 39.75, 48.0, 57.25, 66.5, 74.75]
        vram = [40 * GiB] * int(90 * polls)
        reads = {s: range(int(s * polls), int(s * polls) + 1) for s in spikes}
        for r in reads.values():
            for k in r:
                vram[k] = 70 * GiB
        trace = tmp / "trace.json"
        trace.write_text(
            json.dumps(
                {
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
        read_log = tmp / "reads.log"
        server = Server(
            tmp / "ws",
            assets,
            # BENCH_BACKEND: another checkout's code (an A/B run), with this one's stand-ins.
            PYTHONPATH=os.pathsep.join(
                [
                    str(ROOT / "tests" / "fakes"),
                    os.environ.get("BENCH_BACKEND", str(ROOT / "backend")),
                    str(ROOT / "trainer"),
                ]
            ),
            TUNEDECK_FAKE_SMI_TRACE=str(trace),
            TUNEDECK_FAKE_SMI_READS=str(read_log),
            TUNEDECK_MEMORY_SAMPLE_S=str(sample_s),
        ).start()
        try:
            job = server.submit(
                {
                    "name": "latency",
                    "config": demo_config(assets, max_steps=2000, save_steps=10000, eval_steps=10000),
                    "gpus": 1,
                }
            )

            def first_read(s: float) -> float | None:
                """Wall time of the first read of spike `s` (None: not read yet)."""
                if not read_log.exists():
                    return None
                for line in read_log.read_text().splitlines():
                    dev, k, t = line.split()
                    if dev == "0" and int(k) in reads[s]:
                        return float(t)
                return None

            browser = view = None
            if os.environ.get("PAGE", "1") != "0" and CHROMIUM.exists():
                from playwright.sync_api import sync_playwright

                playwright = sync_playwright().start()
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                view = browser.new_page(bypass_csp=True)  # wait_for_function evaluates a string
                view.goto(f"{server.url}/jobs/{job['id']}")
                view.wait_for_function("window.tunedeckReady === true", timeout=300_000)
                view.evaluate(OBSERVE)
            seen: dict[int, float] = {}
            on_page: dict[int, float] = {}
            last: dict[str, tuple] = {}
            shown: dict[str, tuple] = {}

            def spike_of(t: float) -> int | None:
                """The spike whose first read is nearest the sample an alert names."""
                begun = [(k, r) for k, s in enumerate(spikes) if (r := first_read(s)) is not None]
                return min(begun, key=lambda kr: abs(kr[1] - t))[0] if begun else None

            samples: list[tuple[float, int, float]] = []  # (t, used, first seen in the API)
            cursor = None
            deadline = time.time() + 600
            while len(seen) < len(spikes) and time.time() < deadline:
                if (end := first_read(spikes[-1])) is not None and time.time() > end + 30:
                    break
                # Once spikes recur the engine may name them periodic: either alert moving counts.
                rows = [
                    a
                    for a in server.api.get(f"/api/jobs/{job['id']}/alerts").json()
                    if a["kind"] in ("vram_spike", "vram_periodic_spikes")
                ]
                now = time.time()
                page = server.api.get(
                    f"/api/jobs/{job['id']}/memory",
                    params={"gpu": 0, "limit": 20000, **({"after": cursor} if cursor else {})},
                ).json()
                samples += [(m["t"], m["used_bytes"], now) for m in page["samples"]]
                cursor = page["next"] or cursor
                for a in rows:
                    if last.get(a["kind"]) == (a["t"], a["count"]):
                        continue
                    last[a["kind"]] = (a["t"], a["count"])
                    if (hit := spike_of(a["t"])) is not None:
                        seen.setdefault(hit, now)
                if view is not None:
                    for when, kind, t, count in view.evaluate("window.shownAlerts.splice(0)"):
                        if kind in ("vram_spike", "vram_periodic_spikes") and shown.get(kind) != (t, count):
                            shown[kind] = (t, count)
                            if (hit := spike_of(t)) is not None:
                                on_page.setdefault(hit, when)
                time.sleep(0.05)
            server.api.post(f"/api/jobs/{job['id']}/cancel")
            print(f"sample interval {sample_s:g} s (max of 4 polls), alert interval 1 s")
            lat = []
            for k, s in enumerate(spikes):
                got, t0 = seen.get(k), first_read(s)
                if got and t0:
                    lat.append(got - t0)
                # The sample that holds the spike, and the next one, which confirms it.
                high = [i for i, m in enumerate(samples) if m[1] >= 60 * GiB and t0 and abs(m[0] - t0) < 3]
                confirm = samples[high[-1] + 1] if high and high[-1] + 1 < len(samples) else None
                print(
                    f"spike {k + 1} (read at +{s:.0f} s of sampling): "
                    + (f"alert {got - t0:.2f} s after the first read that saw it" if got and t0 else "missed")
                    + (
                        f"; its sample in the API after {samples[high[0]][2] - t0:.2f} s, the confirming "
                        f"one after {confirm[2] - t0:.2f} s"
                        if confirm and t0
                        else ""
                    )
                )
            page_lat = [
                on_page[k] - t0 for k, s in enumerate(spikes) if k in on_page and (t0 := first_read(s))
            ]
            for name, values in (("alert", lat), ("alert on the page", page_lat)):
                if values:
                    values.sort()
                    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
                    print(
                        f"spike -> {name}: p50 {statistics.median(values):.2f} s, p95 {p95:.2f} s, "
                        f"n={len(values)}; load average {open('/proc/loadavg').read().split()[0]}"
                    )
            if browser is not None:
                browser.close()
                playwright.stop()
            server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=120)
        finally:
            server.stop()


if __name__ == "__main__":
    main()

"""From a trainer_log.jsonl line being written to the point being in an SSE client and in the browser.

A real server and a real CPU demo fine-tune (the tiny model). A thread polls the job's
trainer_log.jsonl every 2 ms and notes when each line appears (the write time, within ~2 ms);
an SSE client on the job stream notes when each step's point arrives, and a headless Chromium on
the job page when it is in the loss chart's data and drawn. Same machine, same clock. Prints
median / p95 per path.

    .venv/bin/python bench/ui_latency.py [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import ARGS, CHROMIUM, Server, assets, demo_config, summary
from tests.sseclient import events


def watch_file(path: Path, written: dict[int, float], stop: threading.Event) -> None:
    pos, buf = 0, b""
    while not stop.is_set():
        if path.exists():
            with path.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
            now = time.time()
            if chunk:
                pos += len(chunk)
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    d = json.loads(line)
                    if "loss" in d:
                        written.setdefault(d["current_steps"], now)
        time.sleep(0.002)


def follow_sse(url: str, job_id: int, arrived: dict[int, float], stop: threading.Event) -> None:
    with (
        httpx.Client(base_url=url, timeout=None) as c,
        c.stream("GET", "/api/stream", params={"job": job_id}) as r,
    ):
        for ev in events(r):
            now = time.time()
            if ev["event"] == "metrics":
                for p in ev["data"]:
                    if p["loss"] is not None:
                        arrived.setdefault(p["step"], now)
            if stop.is_set():
                return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    a = assets()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "ws", a).start()
        try:
            job = server.submit(
                {
                    "name": "latency",
                    "gpus": 0,
                    "config": demo_config(
                        a, max_steps=args.steps, logging_steps=1, eval_steps=10_000, save_steps=10_000
                    ),
                }
            )
            written: dict[int, float] = {}
            sse: dict[int, float] = {}
            stop = threading.Event()
            log = Path(job["output_dir"]) / "trainer_log.jsonl"
            threads = [
                threading.Thread(target=watch_file, args=(log, written, stop), daemon=True),
                threading.Thread(target=follow_sse, args=(server.url, job["id"], sse, stop), daemon=True),
            ]
            for t in threads:
                t.start()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                page = browser.new_page(bypass_csp=True)  # wait_for_function evaluates a string
                page.goto(f"{server.url}/jobs/{job['id']}")
                page.wait_for_function("window.tunedeckReady === true", timeout=60_000)
                final = server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=900)
                time.sleep(2)
                shown = {int(s): t / 1000 for s, t in page.evaluate("window.tunedeck.arrivals")}
                browser.close()
            stop.set()
            sse_lat = [1000 * (sse[s] - written[s]) for s in written if s in sse]
            br_lat = [1000 * (shown[s] - written[s]) for s in written if s in shown]
            print(
                f"job {final['status']}, {len(written)} loss lines written "
                f"(runner poll {server.env.get('TUNEDECK_RUNNER_POLL_S', '0.2')} s, flush 0.5 s defaults)"
            )
            print(f"trainer_log line -> SSE client : {summary(sse_lat)}")
            print(f"trainer_log line -> browser    : {summary(br_lat)}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()

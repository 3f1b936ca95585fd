"""From a trainer_log.jsonl line appended to its SSE event (and, with --browser, to the job page).

    .venv/bin/python bench/live_latency.py [--lines 200] [--interval 0.25] [--watch auto|poll] [--browser]

A real server and a real runner process. The trainer the runner starts is a stand-in that only
waits (tests/utils/standin.py), and this script plays LLaMA-Factory's logging: it appends one
trainer_log.jsonl line at a time, as LLaMA-Factory does (open, write, close), at jittered intervals (so no poll period can line up with them), and
notes the time of each write. An SSE client on the job's stream notes when each step arrives.
Same machine, same clock. Prints p50/p95/p99/max per path.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import ARGS, CHROMIUM, Server, assets, demo_config, summary
from tests.sseclient import events
from tests.utils.standin import release, training_env


def follow_sse(
    url: str, job_id: int, arrived: dict[int, float], ready: threading.Event, stop: threading.Event
) -> None:
    with (
        httpx.Client(base_url=url, timeout=None) as c,
        c.stream("GET", "/api/stream", params={"job": job_id}) as r,
    ):
        for ev in events(r):
            now = time.time()
            ready.set()
            if ev["event"] == "metrics":
                for p in ev["data"]:
                    arrived.setdefault(p["step"], now)
            if stop.is_set():
                return


def until(check, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} after {timeout:g}s")
        time.sleep(0.05)
    return value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument(
        "--interval", type=float, default=0.25, help="mean seconds between lines (jittered ±50%%)"
    )
    ap.add_argument("--watch", choices=("auto", "poll"), default="auto", help="TUNEDECK_RUNNER_WATCH")
    ap.add_argument("--browser", action="store_true", help="also time the job page in headless Chromium")
    args = ap.parse_args()
    a = assets()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = Server(
            tmp / "ws",
            a,
            TUNEDECK_TRAIN_PYTHON=str(training_env(tmp / "train-env")),
            TUNEDECK_RUNNER_WATCH=args.watch,
        ).start()
        page = browser = pw = None
        try:
            job = server.submit({"name": "held", "gpus": 0, "config": demo_config(a)})  # runs until released
            until(
                lambda: server.api.get(f"/api/jobs/{job['id']}").json()["status"] == "running", "running job"
            )
            out = Path(job["output_dir"])
            out.mkdir(parents=True, exist_ok=True)  # a runner that does not make it: LLaMA-Factory would
            sse: dict[int, float] = {}
            ready, stop = threading.Event(), threading.Event()
            threading.Thread(
                target=follow_sse, args=(server.url, job["id"], sse, ready, stop), daemon=True
            ).start()
            until(ready.is_set, "SSE connection")
            if args.browser:
                from playwright.sync_api import sync_playwright

                pw = sync_playwright().start()
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                page = browser.new_page(bypass_csp=True)  # wait_for_function evaluates a string
                page.goto(f"{server.url}/jobs/{job['id']}")
                page.wait_for_function("window.tunedeckReady === true", timeout=60_000)
            time.sleep(1.0)  # let the runner's start-up batches (state, notes, first samples) pass
            written: dict[int, float] = {}
            log = out / "trainer_log.jsonl"
            for step in range(1, args.lines + 1):
                line = json.dumps(
                    {
                        "current_steps": step,
                        "total_steps": args.lines,
                        "loss": 2.0 / step**0.5,
                        "lr": 1e-4,
                        "epoch": step / args.lines,
                        "percentage": 100 * step / args.lines,
                        "elapsed_time": "0:00:01",
                        "remaining_time": "0:00:10",
                    }
                )
                with open(log, "a", encoding="utf-8") as f:  # as LLaMA-Factory's LogCallback writes it
                    f.write(line + "\n")
                written[step] = time.time()
                time.sleep(args.interval * rng.uniform(0.5, 1.5))
            until(lambda: len(sse) >= args.lines, "SSE event for every line", timeout=60)
            shown: dict[int, float] = {}
            if page is not None:
                until(
                    lambda: len(page.evaluate("window.tunedeck.arrivals")) >= args.lines,
                    "every point on the page",
                    timeout=60,
                )
                shown = {int(s): t / 1000 for s, t in page.evaluate("window.tunedeck.arrivals")}
            stop.set()
            sse_ms = [1000 * (sse[s] - written[s]) for s in written]
            print(f"{args.lines} lines, mean interval {args.interval:g}s; runner_watch={args.watch}")
            print(f"trainer_log line -> SSE client : {summary(sse_ms)}")
            if shown:
                br_ms = [1000 * (shown[s] - written[s]) for s in written if s in shown]
                print(f"trainer_log line -> browser    : {summary(br_ms)}")
            release(Path(job["run_dir"]))
            server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=120)
        finally:
            if browser is not None:
                browser.close()
            if pw is not None:
                pw.stop()
            server.stop()


if __name__ == "__main__":
    main()

"""The job page with a 1M-point series: 1M metric points and 1M memory samples in a real SQLite
file, then the page's data requests (over HTTP) and the whole page (headless Chromium) timed: cold
(a fresh browser context, nothing cached) and warm (the same context again: plotly.js from the cache,
its compiled code too), with when plotly.js had run and when the chart data was in.

    .venv/bin/python bench/ui_bigseries.py [--points 1000000] [--workspace DIR]

--workspace keeps the filled database there and reuses it on the next run (filling takes ~40 s).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sqlite3
import tempfile
import time
from pathlib import Path

from _common import ARGS, CHROMIUM, Server, assets, summary


def fill(db: Path, n: int) -> int:
    from tunedeck.store.db import make_engine, upgrade

    engine = make_engine(db)
    upgrade(engine)
    engine.dispose()
    con = sqlite3.connect(db)
    t0 = time.time() - n
    cur = con.execute(
        "INSERT INTO jobs (name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at, last_batch_seq,"
        " current_steps, total_steps, percentage) VALUES ('big', 'succeeded', 1, '{}', 'stage: sft\n', '', '',"
        " '2026-01-01 00:00:00', -1, ?, ?, 100.0)",
        (n, n),
    )
    job = cur.lastrowid
    assert job is not None  # set by the INSERT
    rnd = random.Random(0)

    def metrics():
        for i in range(n):
            loss = 3 * math.exp(-i / (n / 5)) + 0.5 + rnd.random() * 0.1 + (4.0 if i % 99_991 == 0 else 0)
            yield (job, i, t0 + i, i + 1, n, loss, 2e-4 * (1 - i / n), 1500 + rnd.random() * 100, "{}")

    def memory():
        total = 64 * 2**30
        for i in range(n):
            used = int(total * (0.5 + 0.3 * (i / n) + 0.05 * rnd.random())) + (
                8 * 2**30 if i % 77_777 == 0 else 0
            )
            yield (job, i, t0 + i, 0, used, total)

    con.executemany(
        "INSERT INTO metric_points (job_id, line, t, step, total_steps, loss, lr, throughput, raw)"
        " VALUES (?,?,?,?,?,?,?,?,?)",
        metrics(),
    )
    con.executemany(
        "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes) VALUES (?,?,?,?,?,?)",
        memory(),
    )
    con.commit()
    con.close()
    from tunedeck.services.charts import pyramid

    engine = make_engine(db)
    with engine.begin() as c:  # the chart tiles, as ingest would have kept them
        pyramid.catch_up(c)
    engine.dispose()
    return job


# When the plotly.js script finished evaluating (its load event), as the page's performance clock has it.
MARKS = """document.addEventListener("load", (e) => {
  if (e.target.tagName === "SCRIPT" && e.target.src.includes("/vendor/")) window.benchPlotlyAt = performance.now();
}, true);"""


def bundle_url(api, job: int) -> str:
    m = re.search(r'(?:src|href)="(/static/vendor/[^"]+)"', api.get(f"/jobs/{job}").text)
    if m is None:
        raise SystemExit("the job page links no plotly.js bundle under /static/vendor/")
    return m.group(1)


class Loads:
    """The job page's load times: loss chart drawn, everything ready, and where the time went."""

    def __init__(self):
        self.drawn, self.ready, self.plotly, self.data = [], [], [], []

    def load(self, page, url: str) -> None:
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_function("document.querySelector('#loss-chart .scatterlayer .trace')", timeout=120_000)
        self.drawn.append(1000 * (time.perf_counter() - t))
        page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
        self.ready.append(1000 * (time.perf_counter() - t))
        self.plotly.append(page.evaluate("window.benchPlotlyAt"))
        self.data.append(
            page.evaluate(
                "Math.max(...performance.getEntriesByType('resource')"
                ".filter((r) => /series|memory/.test(r.name)).map((r) => r.responseEnd))"
            )
        )

    def report(self, what: str) -> None:
        print(f"job page {what}: loss/lr/throughput charts drawn: {summary(self.drawn)}")
        print(f"job page {what}: everything incl. memory chart, stream open: {summary(self.ready)}")
        print(f"  of which (page clock) plotly.js evaluated at: {summary(self.plotly)}")
        print(f"  of which (page clock) series+memory data in at: {summary(self.data)}")


def timed(fn, repeat: int = 3) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--workspace", type=Path, help="keep the filled database here and reuse it next time")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        ws = args.workspace or Path(tmp) / "ws"
        ws.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        if (ws / "tunedeck.db").exists():
            job = 1
        else:
            job = fill(ws / "tunedeck.db", args.points)
            print(
                f"inserted {args.points:,} metric points + {args.points:,} memory samples"
                f" in {time.perf_counter() - t:.0f}s"
            )
        server = Server(ws, assets()).start()
        try:
            api = server.api
            n = args.points

            def series(**kw):
                r = api.get(f"/api/jobs/{job}/series", params={"max_points": 2000, **kw})
                assert r.status_code == 200, r.text
                return r.json()

            def memory(**kw):
                r = api.get(f"/api/jobs/{job}/memory", params={"max_points": 2000, "limit": 20000, **kw})
                assert r.status_code == 200, r.text
                return r.json()

            t = time.perf_counter()
            s = series()
            print(f"GET series (all {n:,}, 2000 pts), cold : {1000 * (time.perf_counter() - t):.0f}ms")
            assert (
                s["count"] == n
                and len(s["series"]["loss"]["y"]) <= 2000
                and max(s["series"]["loss"]["y"]) > 4
            )
            print(f"GET series again                      : {summary(timed(series))}")
            print(
                f"GET series zoom (10% window)          : {summary(timed(lambda: series(x0=n // 2, x1=n // 2 + n // 10)))}"
            )
            m = memory()
            print(
                f"GET memory (all {n:,}, max_points 2000): {summary(timed(memory))} -> {len(m['samples'])} samples"
            )
            print(
                f"GET memory zoom (10% window)          : "
                f"{summary(timed(lambda: memory(t0=m['samples'][0]['t'] + n / 2, t1=m['samples'][0]['t'] + n * 0.6)))}"
            )
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
                cold, warm = Loads(), Loads()
                for _ in range(3):  # cold: a fresh context, nothing cached; warm: the same context again
                    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
                    context.add_init_script(MARKS)
                    page = context.new_page()
                    cold.load(page, f"{server.url}/jobs/{job}")
                    for _ in range(2):
                        warm.load(page, f"{server.url}/jobs/{job}")
                    context.close()
                print(f"plotly.js bundle served: {len(api.get(bundle_url(api, job)).content):,} bytes")
                cold.report("cold (fresh context)")
                warm.report("warm (same context, again)")
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
                page.goto(f"{server.url}/jobs/{job}")
                page.wait_for_function("window.tunedeckReady === true", timeout=120_000)
                t = time.perf_counter()
                page.evaluate(
                    f"Plotly.relayout('loss-chart', {{'xaxis.range': [{n // 2}, {n // 2 + n // 100}]}})"
                )
                page.wait_for_function(
                    "document.querySelector('#loss-n').textContent.includes('zoomed')", timeout=60_000
                )
                page.wait_for_function(f"window.tunedeck.metrics.loss.step[0] >= {n // 2}", timeout=60_000)
                print(
                    f"zoom to a 1% window, finer points drawn: {1000 * (time.perf_counter() - t):.0f}ms "
                    f"({len(page.evaluate('window.tunedeck.metrics.loss.y'))} points in the window)"
                )
                page.screenshot(
                    path=str(Path(__file__).resolve().parents[1] / "test-output" / "ui" / "job-1M-zoomed.png")
                )
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()

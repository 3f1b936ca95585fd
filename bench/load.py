"""Load: N ingesting runners and M open SSE viewers against one real server, on loopback only.

    .venv/bin/python bench/load.py --runners 8 --viewers 50 --seconds 20

Starts `tunedeck serve` in a temporary workspace (launches paused: the runners here are this
script, posting real telemetry batches with real per-job tokens), runs for a bounded time, and
prints ingest throughput and latency, SSE delivery latency (point written → event received) and
errors. Nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def runner(client: httpx.AsyncClient, job_id: int, token: str, stop: float, stats: dict) -> None:
    seq, line, log_line = 0, 0, 0
    headers = {"Authorization": f"Bearer {token}"}
    while time.time() < stop:
        now = time.time()
        metrics = [{"line": line + i, "t": now, "raw": json.dumps({"current_steps": line + i, "total_steps": 10**6,
                                                                    "loss": 2.0, "lr": 1e-4, "epoch": 0.1})}
                   for i in range(5)]
        logs = [{"line": log_line + i, "t": now, "stream": "stdout", "text": f"step {line + i}"} for i in range(20)]
        t0 = time.perf_counter()
        try:
            r = await client.post(f"/api/jobs/{job_id}/telemetry", json={"seq": seq, "metrics": metrics, "logs": logs},
                                  headers=headers)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        stats["post_ms"].append((time.perf_counter() - t0) * 1000)
        if ok:
            stats["items"] += len(metrics) + len(logs)
            seq, line, log_line = seq + 1, line + 5, log_line + 20
        else:
            stats["errors"] += 1
        await asyncio.sleep(0.5)


async def viewer(url: str, job_id: int, stop: float, stats: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        try:
            async with client.stream("GET", "/api/stream", params={"job": job_id}) as resp:
                stats["viewers_connected"] += 1
                event = None
                async for raw in resp.aiter_lines():
                    if time.time() > stop:
                        return
                    if raw.startswith("event:"):
                        event = raw.split(":", 1)[1].strip()
                    elif raw.startswith("data:") and event == "metrics":
                        now = time.time()
                        for p in json.loads(raw[5:]):
                            stats["delivery_ms"].append((now - p["t"]) * 1000)
        except httpx.HTTPError:
            stats["viewer_errors"] += 1


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runners", type=int, default=8)
    ap.add_argument("--viewers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-load-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(ws), "TUNEDECK_PORT": str(port), "TUNEDECK_LAUNCH_PAUSED": "true"}
    server = subprocess.Popen([sys.executable, "-m", "tunedeck.cli", "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=200),
                                     headers={"X-Tunedeck": "1"}) as client:
            for _ in range(300):
                try:
                    if (await client.get("/api/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
            (ws / "models" / "m").mkdir(parents=True)
            jobs = []
            for i in range(args.runners):
                r = await client.post("/api/jobs", json={"name": f"load-{i}", "gpus": 0, "config": {
                    "model_name_or_path": "models/m", "dataset": "d", "template": "qwen"}})
                r.raise_for_status()
                jobs.append(r.json()["id"])
            # The bench plays the runners: give each job a runner token as the scheduler would.
            tokens = {j: secrets.token_urlsafe(16) for j in jobs}
            with sqlite3.connect(ws / "tunedeck.db") as db:
                for j, tok in tokens.items():
                    db.execute("UPDATE jobs SET runner_token_hash=? WHERE id=?", (hashlib.sha256(tok.encode()).hexdigest(), j))
            stats = {"post_ms": [], "items": 0, "errors": 0, "delivery_ms": [], "viewers_connected": 0,
                     "viewer_errors": 0}
            stop = time.time() + args.seconds
            viewers = [asyncio.create_task(viewer(url, jobs[i % len(jobs)], stop + 1, stats))
                       for i in range(args.viewers)]
            await asyncio.sleep(1)
            await asyncio.gather(*(runner(client, j, tokens[j], stop, stats) for j in jobs))
            await asyncio.sleep(1.5)
            for v in viewers:
                v.cancel()
            await asyncio.gather(*viewers, return_exceptions=True)
        post, dl = stats["post_ms"], stats["delivery_ms"]
        print(f"runners={args.runners} viewers={args.viewers} ({stats['viewers_connected']} connected) "
              f"seconds={args.seconds:g}")
        print(f"ingest: {len(post)} batches, {stats['items'] / args.seconds:.0f} items/s, "
              f"POST p50 {statistics.median(post):.1f} ms, p99 {pct(post, 99):.1f} ms, errors {stats['errors']}")
        print(f"sse: {len(dl)} point deliveries, p50 {pct(dl, 50):.0f} ms, p99 {pct(dl, 99):.0f} ms, "
              f"viewer errors {stats['viewer_errors']}")
    finally:
        server.terminate()
        server.wait(timeout=15)


if __name__ == "__main__":
    asyncio.run(main())

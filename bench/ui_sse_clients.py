"""How many open SSE clients one server process holds with p99 delivery under 1 s.

A real `tunedeck serve`; one job whose telemetry this script posts like a runner (one metric line
every 0.5 s, carrying its send time). N clients follow that job's stream (the job page's stream)
over raw asyncio sockets, so the client side stays light; N grows until p99 passes 1 s or
connections fail. Latency = arrival at a client - the batch's send time.

    .venv/bin/python bench/ui_sse_clients.py [--levels 50,100,200,400,800] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import tempfile
import time
from pathlib import Path

import httpx
from _common import Server, assets, demo_config, pct, play_runner

STEP = re.compile(rb'"step": (\d+)')


def make_job(server: Server, token: str) -> int:
    """A job submitted as any (the server holds launches), then played by this script as its running
    runner: a finished job's batches are refused (its runner token is revoked at the end)."""
    spec = {"name": "sse", "config": demo_config(assets()), "gpus": 0}
    job = server.submit(spec)["id"]
    play_runner(server.workspace / "tunedeck.db", job, token)
    return job


async def client(
    port: int,
    job: int,
    cursor: str,
    sent: dict[int, float],
    lat: list[float],
    ready: asyncio.Event,
    counter: list[int],
    need: int,
    stop: asyncio.Event,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        # The Host a browser on this server's page sends: the guard refuses any other (DNS rebinding).
        f"GET /api/stream?job={job}&cursor={cursor} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n", 1)[0], head
    counter[0] += 1
    if counter[0] >= need:
        ready.set()
    buf, seen = b"", set()
    try:
        while not stop.is_set():
            chunk = await reader.read(65536)
            if not chunk:
                break
            now = time.time()
            buf += chunk
            for m in STEP.finditer(buf):
                s = int(m.group(1))
                if s in sent and s not in seen:  # (the tail kept below may hold it again)
                    seen.add(s)
                    lat.append(1000 * (now - sent[s]))
            buf = buf[-64:]
    finally:
        writer.close()


async def level(
    server: Server, job: int, token: str, n: int, seconds: float, step0: int
) -> tuple[list[float], int, int]:
    async with httpx.AsyncClient(base_url=server.url) as api:
        cursor = (await api.get("/api/stream/cursor")).json()["cursor"]
    sent: dict[int, float] = {}
    lat: list[float] = []
    ready, stop, counter = asyncio.Event(), asyncio.Event(), [0]
    tasks = [
        asyncio.create_task(client(server.port, job, cursor, sent, lat, ready, counter, n, stop))
        for _ in range(n)
    ]
    try:
        await asyncio.wait_for(ready.wait(), 120)
    except asyncio.TimeoutError:
        pass
    connected = counter[0]
    steps = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as api:
        t_end = time.time() + seconds
        while time.time() < t_end:
            step = step0 + steps
            t = time.time()
            sent[step] = t
            raw = json.dumps({"current_steps": step, "total_steps": 10**9, "loss": 1.0, "sent": t})
            r = await api.post(
                f"/api/jobs/{job}/telemetry",
                headers={"Authorization": f"Bearer {token}"},
                json={"seq": step, "metrics": [{"line": step, "t": t, "raw": raw}]},
            )
            r.raise_for_status()
            steps += 1
            await asyncio.sleep(max(0.0, 0.5 - (time.time() - t)))
    await asyncio.sleep(2)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return lat, connected, steps


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="50,100,200,400,800,1200")
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    token = "bench-token"
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "ws", assets(), TUNEDECK_LAUNCH_PAUSED="true").start()
        step0, best = 1, 0
        try:
            job = make_job(server, token)
            # A first batch, unmeasured: the server starts its ingest store with a runner's first.
            r = httpx.post(
                f"{server.url}/api/jobs/{job}/telemetry",
                headers={"Authorization": f"Bearer {token}"},
                json={"seq": 0, "metrics": [{"line": 0, "t": time.time(), "raw": '{"current_steps": 0}'}]},
                timeout=120,
            )
            r.raise_for_status()
            for n in (int(x) for x in args.levels.split(",")):
                lat, connected, steps = await level(server, job, token, n, args.seconds, step0)
                step0 += steps + 1
                expected = connected * steps
                p99 = pct(lat, 99)
                ok = connected == n and len(lat) >= 0.99 * expected and p99 < 1000
                print(
                    f"{n:5d} clients: connected {connected}, deliveries {len(lat)}/{expected}, "
                    f"median {pct(lat, 50):.0f} ms, p95 {pct(lat, 95):.0f} ms, p99 {p99:.0f} ms  {'OK' if ok else 'OVER'}",
                    flush=True,
                )
                if not ok:
                    break
                best = n
        finally:
            server.stop()
    print(f"largest level with p99 < 1 s and every delivery: {best} clients")


if __name__ == "__main__":
    asyncio.run(main())

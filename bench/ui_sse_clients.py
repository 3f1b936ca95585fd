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
import hashlib
import json
import re
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx
from _common import Server, assets, pct

STEP = re.compile(rb'"step": (\d+)')


def make_job(ws: Path, token: str) -> int:
    from tunedeck.store.db import make_engine, upgrade

    engine = make_engine(ws / "tunedeck.db")
    upgrade(engine)
    engine.dispose()
    con = sqlite3.connect(ws / "tunedeck.db")
    cur = con.execute(
        "INSERT INTO jobs (name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at, last_batch_seq,"
        " runner_token_hash) VALUES ('sse', 'succeeded', 0, '{}', 'stage: sft\n', '/tmp', '/tmp',"
        " '2026-01-01 00:00:00', -1, ?)",
        (hashlib.sha256(token.encode()).hexdigest(),),
    )
    con.commit()
    assert cur.lastrowid is not None  # set by the INSERT
    return cur.lastrowid


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
        f"GET /api/stream?job={job}&cursor={cursor} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n", 1)[0], head
    counter[0] += 1
    if counter[0] >= need:
        ready.set()
    buf = b""
    try:
        while not stop.is_set():
            chunk = await reader.read(65536)
            if not chunk:
                break
            now = time.time()
            buf += chunk
            for m in STEP.finditer(buf):
                s = int(m.group(1))
                if s in sent:
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
        ws = Path(tmp) / "ws"
        ws.mkdir()
        job = make_job(ws, token)
        server = Server(ws, assets()).start()
        step0, best = 0, 0
        try:
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

"""Load: N ingesting runners and M open SSE viewers against one real server, on loopback only.

    .venv/bin/python bench/load.py --runners 8 --viewers 50 --seconds 20
    .venv/bin/python bench/load.py --shape memory --runners 8 --viewers 0 --batch 2000 --encoding columns

Starts `tunedeck serve` in a temporary workspace (launches paused: the runners here are this
script, posting real telemetry batches with real per-job tokens), runs for a bounded time, and
prints ingest throughput and latency, the server's CPU per ingested value, SSE delivery latency
(point written → event received) and errors. Nothing but 127.0.0.1 is contacted.

Shapes: `lines` is an ordinary runner (5 trainer_log lines and 20 log lines every 0.5 s); `memory`
is one value a row (memory samples of 8 GPUs), posted back to back as fast as the server acks,
as `rows` (a list of objects), `columns` (JSON, one array per field) or `packed` (binary columns after a
JSON header, tunedeck.contract.wire: what the runner sends; needs a server that takes it). For
`memory`, a reader polls the SQLite file and reports how long after its ack a batch is stored.
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
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.utils.datasets import add_dataset  # noqa: E402


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
        metrics = [
            {
                "line": line + i,
                "t": now,
                "raw": json.dumps(
                    {"current_steps": line + i, "total_steps": 10**6, "loss": 2.0, "lr": 1e-4, "epoch": 0.1}
                ),
            }
            for i in range(5)
        ]
        logs = [
            {"line": log_line + i, "t": now, "stream": "stdout", "text": f"step {line + i}"}
            for i in range(20)
        ]
        t0 = time.perf_counter()
        try:
            r = await client.post(
                f"/api/jobs/{job_id}/telemetry",
                json={"seq": seq, "metrics": metrics, "logs": logs},
                headers=headers,
            )
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


def memory_body(seq: int, first: int, n: int, t0: float, encoding: str) -> bytes:
    """One batch of `n` samples of 8 GPUs: the bench must stay cheap next to the server."""
    lines = range(first, first + n)
    if (
        encoding == "packed"
    ):  # what runners send (tunedeck.contract.wire), built with numpy: see packed_like_runner
        return packed_body(seq, first, n, t0)
    if encoding == "columns":
        cols = {
            "line": ",".join(map(str, lines)),
            "t": ",".join(f"{t0 + i / 8:.3f}" for i in lines),
            "gpu": ",".join(str(i % 8) for i in lines),
            "used_bytes": ",".join(str(40_000_000_000 + (i * 7919) % 1_000_000_000) for i in lines),
            "total_bytes": ",".join(["206158430208"] * n),
        }
        inner = ",".join(f'"{k}":[{v}]' for k, v in cols.items())
        return f'{{"seq":{seq},"memory":{{{inner}}}}}'.encode()
    rows = ",".join(
        f'{{"line":{i},"t":{t0 + i / 8:.3f},"gpu":{i % 8},'
        f'"used_bytes":{40_000_000_000 + (i * 7919) % 1_000_000_000},"total_bytes":206158430208}}'
        for i in lines
    )
    return f'{{"seq":{seq},"memory":[{rows}]}}'.encode()


def packed_columns(first: int, n: int, t0: float) -> dict:
    import numpy as np

    i = np.arange(first, first + n, dtype=np.int64)
    return {
        "line": i,
        "t": np.round(t0 + i / 8, 3),
        "gpu": (i % 8).astype(np.int32),
        "used_bytes": 40_000_000_000 + (i * 7919) % 1_000_000_000,
        "total_bytes": np.full(n, 206158430208, dtype=np.int64),
    }


def packed_body(seq: int, first: int, n: int, t0: float) -> bytes:
    """The packed batch the runner's `wire.encode` makes of these samples, laid out with numpy
    (the runner's pure-Python packing would cost this one-process client more than the server)."""
    import struct

    cols = packed_columns(first, n, t0)
    head = json.dumps({"seq": seq, "memory": {"n": n, "columns": list(cols)}}, separators=(",", ":")).encode()
    layout = {"line": "<i8", "t": "<f8", "gpu": "<i4", "used_bytes": "<i8", "total_bytes": "<i8"}
    return b"".join(
        (b"TDB1", struct.pack("<I", len(head)), head, *(cols[k].astype(layout[k]).tobytes() for k in cols))
    )


def packed_like_runner(t0: float) -> None:
    """The numpy layout is byte for byte what the runner sends; checked before every run."""
    from tunedeck.contract import wire

    cols = {k: v.tolist() for k, v in packed_columns(16, 40, t0).items()}
    if wire.encode({"seq": 3, "memory": cols}) != packed_body(3, 16, 40, t0):
        raise SystemExit("bench/load.py: the packed bodies differ from tunedeck.contract.wire.encode's")


async def memory_runner(
    client: httpx.AsyncClient, job_id: int, token: str, stop: float, stats: dict, batch: int, encoding: str
) -> None:
    kind = "application/vnd.tunedeck.batch" if encoding == "packed" else "application/json"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": kind}
    seq, line, t0 = 1, 1, time.time()  # line 0: the warm-up batch
    while time.time() < stop:
        body = memory_body(seq, line, batch, t0, encoding)
        start = time.perf_counter()
        try:
            r = await client.post(f"/api/jobs/{job_id}/telemetry", content=body, headers=headers)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        stats["post_ms"].append((time.perf_counter() - start) * 1000)
        if ok:
            stats["items"] += batch
            stats["acks"].append((job_id, line + batch - 1, time.time()))
            seq, line = seq + 1, line + batch
        else:
            stats["errors"] += 1
            if stats["errors"] < 3:
                print(f"refused: {r.status_code} {r.text[:300]}" if not isinstance(r, Exception) else r)


def watch_stored(db: Path, jobs: list[int], stored: dict, stop: threading.Event) -> None:
    """Polls the newest stored sample of each job: (job, line) -> first time seen stored."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    # The newest sample of each of the job's 8 devices: one seek each in the (job, node, gpu, t) key.
    newest = (
        "SELECT max((SELECT line FROM memory_samples m WHERE m.job_id = ? AND m.node = '' "
        "AND m.gpu = g.value ORDER BY m.t DESC LIMIT 1)) FROM json_each('[0,1,2,3,4,5,6,7]') g"
    )
    while not stop.is_set():
        now = time.time()
        for job in jobs:
            top = conn.execute(newest, (job,)).fetchone()[0]
            if top is not None:
                stored[job].append((top, now))
        stop.wait(0.05)
    conn.close()


def play_runner(db: sqlite3.Connection, job: int, token: str) -> None:
    """This process as the job's runner, as the scheduler records one it launched: the runner token,
    the job running, and this process's pid and start time (so the server sees its runner alive, and
    judges the job's series as a running job's); the job holds the 8 GPUs its samples name (a runner
    reports only its job's devices)."""
    db.execute(
        "UPDATE jobs SET runner_token_hash = ?, status = 'running', started_at = datetime('now'), gpus = 8, "
        "runner_pid = ?, runner_started = ? WHERE id = ?",
        (hashlib.sha256(token.encode()).hexdigest(), os.getpid(), psutil.Process().create_time(), job),
    )


def machine_speed() -> float:
    """CPU ms of a fixed piece of work like the server's (rows into SQLite, a Python loop), best of 3:
    this VM's speed swings by a third within the hour, and this says which speed a run had."""
    best = float("inf")
    for _ in range(3):
        c = time.process_time()
        db = sqlite3.connect(":memory:")
        db.execute(
            "CREATE TABLE s (id INTEGER PRIMARY KEY, job INT, gpu INT, t REAL, used INT, UNIQUE (job, gpu, t))"
        )
        db.executemany(
            "INSERT INTO s (job, gpu, t, used) VALUES (?, ?, ?, ?)",
            ((i % 8, i % 7, i / 8, i * 7919) for i in range(100_000)),
        )
        sum(x * x for x in range(300_000))
        db.close()
        best = min(best, 1000 * (time.process_time() - c))
    return best


def tree_cpu(proc: psutil.Process) -> dict[int, float]:
    """CPU seconds so far of the server and of its child processes (its ingest store), by pid."""
    out = {}
    for p in (proc, *proc.children(recursive=True)):
        try:
            out[p.pid] = sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return out


def watch_rss(proc: psutil.Process, seen: list[float], stop: threading.Event) -> None:
    """The server's resident memory (MiB), read every 0.2 s while the writers run."""
    while not stop.is_set():
        try:
            seen.append(sum(p.memory_info().rss for p in (proc, *proc.children(recursive=True))) / 2**20)
        except psutil.Error:
            return
        stop.wait(0.2)


def ack_lag(acks: list[tuple[int, int, float]], stored: dict) -> list[float]:
    """For each acked batch, seconds from its ack to the first poll that saw its last line stored
    (negative: stored before the ack reached the client)."""
    out = []
    for job, last, t_ack in acks:
        seen = next((t for top, t in stored[job] if top >= last), None)
        if seen is not None:
            out.append(seen - t_ack)
    return out


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
    ap.add_argument("--shape", choices=("lines", "memory"), default="lines")
    ap.add_argument("--batch", type=int, default=2000, help="samples a batch (shape memory)")
    ap.add_argument(
        "--encoding", choices=("rows", "columns", "packed"), default="packed", help="memory batch form"
    )
    args = ap.parse_args()
    speed = machine_speed()
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-load-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "TUNEDECK_WORKSPACE": str(ws),
        "TUNEDECK_PORT": str(port),
        "TUNEDECK_LAUNCH_PAUSED": "true",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "tunedeck.cli.main", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = psutil.Process(server.pid)
    try:
        async with httpx.AsyncClient(
            base_url=url, timeout=30, limits=httpx.Limits(max_connections=200), headers={"X-Tunedeck": "1"}
        ) as client:
            for _ in range(300):
                try:
                    if (await client.get("/api/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
            (ws / "models" / "m").mkdir(parents=True)
            add_dataset(ws / "data")  # the "d" the jobs name: a submit refuses a dataset it cannot find
            jobs = []
            for i in range(args.runners):
                r = await client.post(
                    "/api/jobs",
                    json={
                        "name": f"load-{i}",
                        "gpus": 0,
                        "config": {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen"},
                    },
                )
                r.raise_for_status()
                jobs.append(r.json()["id"])
            # The bench plays the runners.
            tokens = {j: secrets.token_urlsafe(16) for j in jobs}
            with sqlite3.connect(ws / "tunedeck.db") as db:
                for j, tok in tokens.items():
                    play_runner(db, j, tok)
            stats: dict[str, Any] = {
                "post_ms": [],
                "items": 0,
                "errors": 0,
                "delivery_ms": [],
                "viewers_connected": 0,
                "viewer_errors": 0,
                "acks": [],
            }
            stored: dict[int, list] = {j: [] for j in jobs}
            done = threading.Event()
            watcher = threading.Thread(
                target=watch_stored, args=(ws / "tunedeck.db", jobs, stored, done), daemon=True
            )
            stop = time.time() + args.seconds
            viewers = [
                asyncio.create_task(viewer(url, jobs[i % len(jobs)], stop + 1, stats))
                for i in range(args.viewers)
            ]
            await asyncio.sleep(1)
            if args.shape == "memory":
                watcher.start()
            if args.shape == "memory":
                # One sample a job first: the server starts its ingest store with the first batch,
                # and that start-up is not ingest's cost.
                if args.encoding == "packed":
                    packed_like_runner(time.time())
                for j in jobs:
                    r = await client.post(
                        f"/api/jobs/{j}/telemetry",
                        content=memory_body(0, 0, 1, time.time(), args.encoding),
                        headers={
                            "Authorization": f"Bearer {tokens[j]}",
                            "Content-Type": "application/vnd.tunedeck.batch"
                            if args.encoding == "packed"
                            else "application/json",
                        },
                    )
                    r.raise_for_status()
            rss: list[float] = []
            rss_stop = threading.Event()
            threading.Thread(target=watch_rss, args=(proc, rss, rss_stop), daemon=True).start()
            cpu0, wall0, me0 = tree_cpu(proc), time.time(), time.process_time()
            if args.shape == "memory":
                await asyncio.gather(
                    *(
                        memory_runner(client, j, tokens[j], stop, stats, args.batch, args.encoding)
                        for j in jobs
                    )
                )
            else:
                await asyncio.gather(*(runner(client, j, tokens[j], stop, stats) for j in jobs))
            cpu1, wall1, me1 = tree_cpu(proc), time.time(), time.process_time()
            per_pid = {pid: cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1}
            server_cpu = sum(per_pid.values())
            rss_stop.set()
            # How the alert detectors got the samples: from the writer's columns, or read back.
            fed = {
                line.split('"')[1]: float(line.split()[-1])
                for line in (await client.get("/metrics")).text.splitlines()
                if line.startswith("tunedeck_alert_samples_fed_total{")
            }
            await asyncio.sleep(1.5)
            done.set()
            for v in viewers:
                v.cancel()
            await asyncio.gather(*viewers, return_exceptions=True)
        post, dl = stats["post_ms"], stats["delivery_ms"]
        wall, items = wall1 - wall0, stats["items"]
        print(
            f"shape={args.shape}"
            + (f" batch={args.batch} encoding={args.encoding}" if args.shape == "memory" else "")
            + f" runners={args.runners} viewers={args.viewers} ({stats['viewers_connected']} connected) "
            f"seconds={wall:.1f}; machine: {speed:.0f} ms for the reference work (lower is faster)"
        )
        print(
            f"ingest: {len(post)} batches, {items / wall:.0f} values/s, "
            f"server CPU {1e6 * server_cpu / max(1, items):.1f} µs/value ({server_cpu / wall:.0%} of a core"
            + (
                f": {' + '.join(f'{v / wall:.0%}' for v in per_pid.values())} by process"
                if len(per_pid) > 1
                else ""
            )
            + "), "
            f"POST p50 {statistics.median(post):.1f} ms, p99 {pct(post, 99):.1f} ms, errors {stats['errors']}; "
            f"this client {(me1 - me0) / wall:.0%} of a core, load average {os.getloadavg()[0]:.1f}"
        )
        if fed:
            print("alert detectors fed: " + ", ".join(f"{k} {v:.0f}" for k, v in fed.items()))
        print(
            f"server RSS under load (its store process included): peak {max(rss, default=float('nan')):.0f} MiB, end {rss[-1] if rss else float('nan'):.0f} MiB"
        )
        if args.shape == "memory":
            watcher.join(timeout=10)
            lag = ack_lag(stats["acks"], stored)
            with sqlite3.connect(ws / "tunedeck.db") as db:
                rows = db.execute("SELECT count(*) FROM memory_samples").fetchone()[0]
            print(
                f"ack -> stored (polled every 50 ms): p50 {pct(lag, 50):+.3f} s, p99 {pct(lag, 99):+.3f} s, "
                f"max {max(lag, default=float('nan')):+.3f} s; {len(lag)}/{len(stats['acks'])} acked batches seen; "
                f"rows stored {rows}, values acked {items}"
            )
        if args.viewers:
            print(
                f"sse: {len(dl)} point deliveries, p50 {pct(dl, 50):.0f} ms, p99 {pct(dl, 99):.0f} ms, "
                f"viewer errors {stats['viewer_errors']}"
            )
    finally:
        server.terminate()
        server.wait(timeout=15)


if __name__ == "__main__":
    asyncio.run(main())

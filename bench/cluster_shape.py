"""A cluster's telemetry shape against one server, and against an older checkout side by side.

    PYTHONPATH=$PWD/backend:$PWD/trainer .venv/bin/python bench/cluster_shape.py [--ref REV]
        [--seconds 30] [--warm-s 10] [--viewers 200] [--history-s 600] [--jobs 50] [--py-spy PREFIX]

A simulated 64-node, 512-GPU cluster: `--jobs` running jobs of 8 or 16 GPUs (a 16-GPU job on two
nodes: two runners), their runners played by this script over HTTP at 1 Hz (each runner's 8 GPU
memory samples a second, JSON columns; the job's first runner adds one trainer_log line a second),
after `--history-s` seconds of each job's history posted at once (what a running job has stored: the
team row's cost grew with it). `--viewers` follow the team stream (the first 20 parse it, the rest
only read it: the client stays light) and `--job-viewers` follow job pages.

It prints, for each server: batches accepted (acknowledged, of those a 1 Hz runner offers in the
window; a runner still waiting on its last POST sends the missed seconds with its next one), POST p50
and p99, team-event p50 and p99 (a trainer_log line's time -> the first team event that shows its
step, per parsing viewer: a runner held up by slow POSTs counts), job-event p50 and p99 (a line's time
-> its `metrics` event), the server's CPU (its process tree, as a share of one core), this client's,
and `uptime` before and after the window (after `--warm-s` unmeasured seconds at 1 Hz):
on a shared machine the load says what the figures are worth. With `--ref REV` the same runs first
on REV's code (a `git worktree` in a temporary folder, removed after), the two printed side by side.
Nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import ROOT, Server, assets, demo_config, pct, play_runner

GiB = 1 << 30
TOTAL = 141 * GiB
NODES, PER_NODE = 64, 8
PARSED = 20  # team viewers that parse what they read
STEPS = re.compile(rb'"id": ?(\d+),.*?"current_steps": ?(\d+)')


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("  ")[-1]


def shapes(jobs: int) -> list[int]:
    """Each job's node count: as many 16-GPU (2-node) jobs as fill the cluster with the rest on 8."""
    two = max(0, min(jobs, NODES - jobs))
    return [2] * two + [1] * (jobs - two)


def memory(node_seed: int, first: int, n: int, t0: float) -> dict:
    """n ticks of 8 GPUs: a level with noise, now and then a spike (the detectors have work)."""
    line, t, gpu, used = [], [], [], []
    for k in range(first, first + n):
        for g in range(PER_NODE):
            h = (k * 7919 + g * 104729 + node_seed * 15485863) % 1000
            line.append(k)
            t.append(round(t0 + k, 3))
            gpu.append(g)
            used.append(60 * GiB + h * 2**18 + (20 * GiB if h == 7 else 0))
    return {"line": line, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": [TOTAL] * len(line)}


def metric(k: int, t: float) -> dict:
    raw = {"current_steps": k + 1, "total_steps": 10**6, "loss": 2.0 - k * 1e-5, "lr": 1e-4}
    return {"line": k, "t": t, "raw": json.dumps(raw)}


class Runner:
    """One node's runner of one job."""

    def __init__(self, job: int, node: str, token: str, first: bool, seed: int):
        self.job, self.node, self.token, self.first, self.seed = job, node, token, first, seed
        self.seq, self.tick = 0, 0  # the next batch's seq; the next second to send

    def body(self, upto: int, t0: float) -> dict:
        n = upto - self.tick
        batch = {"seq": self.seq, "node": self.node, "memory": memory(self.seed, self.tick, n, t0)}
        if self.first:
            batch["metrics"] = [metric(k, t0 + k) for k in range(self.tick, upto)]
        return batch


async def post(client: httpx.AsyncClient, r: Runner, batch: dict) -> bool:
    resp = await client.post(
        f"/api/jobs/{r.job}/telemetry", json=batch, headers={"Authorization": f"Bearer {r.token}"}
    )
    if resp.status_code != 200:
        print(f"refused: {resp.status_code} {resp.text[:200]}", file=sys.stderr)
    return resp.status_code == 200


async def play(client, r: Runner, t0: float, start: int, stop: int, stats: dict, sent: dict) -> None:
    """At 1 Hz from second `start` to `stop` (of t0): each tick's samples, or every tick missed while
    the last POST was waiting."""
    while True:
        k = int(time.time() - t0) + 1  # seconds fully sampled
        if k > stop:
            return
        if k <= r.tick:
            await asyncio.sleep(t0 + r.tick - time.time() + 0.01)
            continue
        batch = r.body(k, t0)
        if r.first:  # each line's step, at the time the line was written (its tick)
            for s in range(r.tick, k):
                sent[(r.job, s + 1)] = t0 + s
        began = time.perf_counter()
        try:
            ok = await post(client, r, batch)
        except httpx.HTTPError:
            ok = False
        stats["post_ms"].append(1000 * (time.perf_counter() - began))
        if ok:
            stats["acked"] += 1
            r.seq, r.tick = r.seq + 1, k
        else:
            stats["errors"] += 1


async def sse(port: int, path: str, on_event, stop: asyncio.Event, stats: dict) -> None:
    """A raw SSE client (a browser's EventSource, lighter): `on_event(data bytes)` per event, or None."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"{path}: {head[:200]!r}")
    stats["connected"] += 1
    buf = b""
    try:
        while not stop.is_set():
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            if on_event is None:
                continue
            buf += chunk
            *events, buf = buf.split(b"\r\n\r\n")
            now = time.time()
            for ev in events:
                on_event(ev, now)
    finally:
        writer.close()


def team_viewer(sent: dict, lat: list, seen: set):
    def on_event(ev: bytes, now: float) -> None:
        for job, step in STEPS.findall(ev):
            key = (int(job), int(step))
            if key in sent and key not in seen:
                seen.add(key)
                lat.append(1000 * (now - sent[key]))

    return on_event


def job_viewer(lat: list, window: dict):
    def on_event(ev: bytes, now: float) -> None:
        if b"event: metrics" in ev:
            for line in ev.split(b"\r\n"):
                if line.startswith(b"data: "):
                    lat.extend(
                        1000 * (now - p["t"]) for p in json.loads(line[6:]) if p["t"] >= window["from"]
                    )

    return on_event


def tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


async def measure(code: Path, args, label: str) -> dict:
    """One server on `code`'s backend, the cluster played against it."""
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-cluster-"))
    path = f"{code}/backend:{code}/trainer"
    server = Server(ws / "ws", assets(), TUNEDECK_LAUNCH_PAUSED="true", PYTHONPATH=path).start()
    try:
        return await _measure(server, args, label)
    finally:
        server.stop()


async def _measure(server: Server, args, label: str) -> dict:
    db = server.workspace / "tunedeck.db"
    runners: list[Runner] = []
    node = 0
    for i, nodes in enumerate(shapes(args.jobs)):
        job = server.submit({"name": f"cl-{i}", "config": demo_config(assets()), "gpus": 0})["id"]
        token = secrets.token_urlsafe(16)
        play_runner(db, job, token, gpus=PER_NODE, nodes=nodes)
        for n in range(nodes):
            runners.append(Runner(job, f"node-{node:02d}", token, n == 0, node))
            node += 1
    limits = httpx.Limits(max_connections=len(runners) + 10)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        t0 = float(int(time.time()) - args.history_s)
        # Each job's history so far, one batch a runner (the first also starts the ingest store).
        sem = asyncio.Semaphore(8)

        async def history(r: Runner) -> None:
            async with sem:
                if not await post(client, r, r.body(args.history_s, t0)):
                    raise RuntimeError("a history batch was refused")
                r.seq, r.tick = 1, args.history_s

        await asyncio.gather(*(history(r) for r in runners))
        stop = asyncio.Event()
        stats: dict[str, Any] = {"post_ms": [], "acked": 0, "errors": 0, "connected": 0}
        sent: dict = {}
        team_lat: list[float] = []
        job_lat: list[float] = []
        window = {"from": math.inf}  # the measured window's first second (job events before it: not timed)
        cursor = (await client.get("/api/stream/cursor")).json()["cursor"]
        viewers = [
            asyncio.create_task(
                sse(
                    server.port,
                    "/api/stream",
                    team_viewer(sent, team_lat, set()) if i < PARSED else None,
                    stop,
                    stats,
                )
            )
            for i in range(args.viewers)
        ] + [
            asyncio.create_task(
                sse(
                    server.port,
                    f"/api/stream?job={runners[i % len(runners)].job}&cursor={cursor}",
                    job_viewer(job_lat, window),
                    stop,
                    stats,
                )
            )
            for i in range(args.job_viewers)
        ]
        while stats["connected"] < len(viewers) and not any(v.done() for v in viewers):
            await asyncio.sleep(0.2)
        start = int(time.time() - t0) + 1
        for r in runners:  # the 1 Hz play starts now: the seconds spent on the history are a gap
            r.tick = start
        # Unmeasured seconds first: the alert engine builds each job's detectors from its history.
        warm: dict = {"post_ms": [], "acked": 0, "errors": 0}
        await asyncio.gather(*(play(client, r, t0, start, start + args.warm_s, warm, {}) for r in runners))
        start += args.warm_s
        window["from"] = t0 + start
        assert server.proc is not None  # started above
        before, proc = uptime(), psutil.Process(server.proc.pid)
        spy = None
        if args.py_spy:  # where the server's CPU goes in the window: collapsed stacks, its children too
            out = f"{args.py_spy}-{label.replace(' ', '-')}.txt"
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(proc.pid)]
                + ["--subprocesses", "--nonblocking", "--duration", str(args.seconds), "--rate", "50"]
                + ["--format", "raw", "--output", out],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        cpu0, me0, wall0 = tree_cpu(proc), time.process_time(), time.time()
        await asyncio.gather(
            *(play(client, r, t0, start, start + args.seconds, stats, sent) for r in runners)
        )
        cpu1, me1, wall1 = tree_cpu(proc), time.process_time(), time.time()
        after = uptime()
        if spy is not None:
            spy.wait()
        await asyncio.sleep(2)  # the last events on their way
        stop.set()
        for v in viewers:
            v.cancel()
        await asyncio.gather(*viewers, return_exceptions=True)
    wall = wall1 - wall0
    offered = len(runners) * args.seconds
    return {
        "batches accepted": f"{100 * stats['acked'] / offered:.0f} % of {offered}",
        "POST p50 / p99": f"{statistics.median(stats['post_ms']):.0f} / {pct(stats['post_ms'], 99):.0f} ms",
        "team event p50 / p99": f"{pct(team_lat, 50):.0f} / {pct(team_lat, 99):.0f} ms (n={len(team_lat)})",
        "job event p50 / p99": f"{pct(job_lat, 50):.0f} / {pct(job_lat, 99):.0f} ms (n={len(job_lat)})",
        "server CPU": f"{(cpu1 - cpu0) / wall:.2f} of a core",
        "this client's CPU": f"{(me1 - me0) / wall:.2f} of a core",
        "errors": str(stats["errors"]),
        "uptime before": before,
        "uptime after": after,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--viewers", type=int, default=200)
    ap.add_argument("--job-viewers", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--warm-s", type=int, default=10, help="unmeasured seconds at 1 Hz before the window")
    ap.add_argument("--history-s", type=int, default=600, help="seconds of each job's history first")
    ap.add_argument("--py-spy", metavar="PREFIX", help="record each server with py-spy into PREFIX-<run>.txt")
    ap.add_argument("--ref", help="a git revision to run the same against first (e.g. HEAD~4, main)")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"{args.jobs} jobs on {NODES} nodes x {PER_NODE} GPUs, 1 Hz, {args.history_s} s of history, "
        f"{args.viewers} team viewers, {args.job_viewers} job viewers, {args.warm_s} s + {args.seconds} s; "
        f"{os.cpu_count()} CPUs, {uptime()}",
        flush=True,
    )
    runs: dict[str, dict] = {}
    if args.ref:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.ref],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            ref = Path(tmp) / "ref"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref), rev], check=True)
            try:
                runs[f"ref {rev}"] = await measure(ref, args, f"ref {rev}")
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], check=False
                )
    runs["this tree"] = await measure(ROOT, args, "this tree")
    width = max(len(v) for r in runs.values() for v in r.values())
    print(f"{'':22}" + "".join(f"{name:<{width + 2}}" for name in runs))
    for key in next(iter(runs.values())):
        print(f"{key:22}" + "".join(f"{r[key]:<{width + 2}}" for r in runs.values()))


if __name__ == "__main__":
    asyncio.run(main())

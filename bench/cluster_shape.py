"""A cluster's telemetry shape against one server, and against an older checkout side by side.

    PYTHONPATH=$PWD/backend:$PWD/trainer .venv/bin/python bench/cluster_shape.py [--ref REV]
        [--jobs 50] [--gpus G] [--viewers 200] [--job-viewers 20] [--seconds 30] [--warm-s 10]
        [--history-h 0.17] [--spikes 15] [--restart] [--py-spy PREFIX] [--ref-hide MODULES]

A simulated 64-node, 512-GPU cluster: `--jobs` running jobs of 8 or 16 GPUs (as many 16-GPU jobs,
two nodes and two runners each, as fill the 64 nodes), or of `--gpus` each (8 a node). Their
runners are played by this script over HTTP at 1 Hz, each at its own phase within the second, as a
real runner's batches look (`tunedeck.runner.report.body`: packed columns after a JSON header, the
runner's headers): every GPU's memory sample a second (line, t, gpu, used, total, util, power,
temperature, name) and, from the job's first runner, one trainer_log line a job-second. A runner
still waiting on its last POST sends the seconds it missed with its next one. Before the play,
`--history-h` hours of each job's history are posted in chunks (what a running job has stored: a
cost that grows with it shows here). `--viewers` follow the team stream (the first 20 parse it, the
rest only read it), `--job-viewers` follow job pages. `--spikes` one-sample spikes (+30 GiB on one
device of one job) are injected at random seconds of the window. `--restart` stops the server after
the history and starts it again: how soon it answers, and how long each runner's first batch then
waits (the alert engine resumes each job's detector state, saved as the server stopped, from the rows
stored after it; a server before those saves built them from the whole stored series meanwhile).

It prints, for each server: batches accepted (acknowledged, of those a 1 Hz runner offers in the
window), POST p50 and p99, team-event p50 and p99 (a trainer_log line's time -> the first team event
whose row shows that step or a later one, per parsing viewer), job-event p50 and p99 (a line's time
-> its `metrics` event), spike -> alert p95 (the POST carrying the spike -> its `vram_spike` or
`vram_periodic_spikes` row naming that sample; spikes never alerted in the run are counted apart),
the server's CPU (its whole process tree: the ingest store process too), the WAL file's size at
the window's start and end (checkpoints starved by readers show as growth), and `uptime` before and
after the window (after `--warm-s` unmeasured seconds at 1 Hz, where the alert engine builds each
job's detectors from its history): on a shared machine the load says what the figures are worth.

The load generator's own CPU is kept apart from the server's: the server's CPU is read from its own
process tree (psutil `cpu_times`, user + system), which nothing of this script enters; the viewers
run in a second process (`multiprocessing`, spawn), so the runners' 1 Hz play and the SSE reading do
not share one event loop; each client process prints its CPU and its event loop's lag (how late a
10 ms timer fires, p99): when that lag nears the latencies measured, the client, not the server, was
late. The spike watcher reads the server's SQLite file read-only, from this process (no HTTP load).
On a 2-core machine the client still competes with the server for the cores: scale the shape down
(`--jobs 10 --gpus 8 --viewers 50 --seconds 60`) and compare runs with the same flags, the `uptime`
beside each. With `--ref REV` the same runs first on REV's code (a `git worktree` in a temporary
folder, removed after), the two printed side by side; `--ref-hide uvloop,httptools` runs REV's server
without those (they are dependencies since 2026-12-07; uvicorn takes them whenever they import, so a
ref in the same virtual environment would run with them too). Nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import re
import resource
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import ROOT, Server, assets, demo_config, pct, play_runner

from tunedeck.runner.report import body as packed_body
from tunedeck.services.ingest import upkeep

GiB = 1 << 30
TOTAL = 141 * GiB
NODES, PER_NODE = 64, 8
PARSED = 20  # team viewers that parse what they read
SPIKE = 30 * GiB
HISTORY_CHUNK_S = 2000  # seconds of one runner's history a POST (8 GPUs: 16k samples, under the cap)
ROW = re.compile(rb'"id": ?(\d+),.*?"current_steps": ?(\d+)')


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("  ")[-1]


def shapes(jobs: int, gpus: int | None) -> list[list[int]]:
    """Each job's runners, as their GPU counts: 16-GPU (2-node) jobs and 8-GPU ones filling the
    64 nodes, or `gpus` each (8 a node)."""
    if gpus:
        return [[min(PER_NODE, gpus - k) for k in range(0, gpus, PER_NODE)] for _ in range(jobs)]
    two = max(0, min(jobs, NODES - jobs))
    return [[PER_NODE] * 2] * two + [[PER_NODE]] * (jobs - two)


def level(seed: int, g: int, k: int) -> int:
    """A device's used bytes at second k: a level with noise, now and then a spike of its own (the
    detectors have work)."""
    h = (k * 7919 + g * 104729 + seed * 15485863) % 1000
    return 60 * GiB + h * 2**18 + (20 * GiB if h == 7 else 0)


class Runner:
    """One node's runner of one job."""

    def __init__(self, job: int, node: str, token: str, first: bool, seed: int, gpus: int, phase: float):
        self.job, self.node, self.token, self.first, self.seed = job, node, token, first, seed
        self.gpus, self.phase = gpus, phase  # its devices; where in each second it samples
        self.seq, self.tick = 0, 0  # the next batch's seq; the next second to send
        self.spikes: dict[int, int] = {}  # second -> device spiked then

    def t(self, t0: float, k: int) -> float:
        return round(t0 + k + self.phase, 3)

    def body(self, upto: int, t0: float) -> dict:
        """The seconds from `tick` to `upto` (excluded) as the runner's reporter batches them."""
        cols: dict[str, list] = {
            k: []
            for k in ("line", "t", "gpu", "used_bytes", "total_bytes", "util", "power_w", "temp_c", "name")
        }
        for k in range(self.tick, upto):
            for g in range(self.gpus):
                cols["line"].append(k * self.gpus + g)
                cols["t"].append(self.t(t0, k))
                cols["gpu"].append(g)
                cols["used_bytes"].append(level(self.seed, g, k) + (SPIKE if self.spikes.get(k) == g else 0))
                cols["total_bytes"].append(TOTAL)
                cols["util"].append(97.0)
                cols["power_w"].append(650.0)
                cols["temp_c"].append(61.0)
                cols["name"].append("NVIDIA H200")
        batch: dict[str, Any] = {"seq": self.seq, "node": self.node, "metrics": [], "logs": [], "states": []}
        if upto > self.tick:
            batch["memory"] = cols
        if self.first:
            batch["metrics"] = [metric(k, self.t(t0, k)) for k in range(self.tick, upto)]
        return batch


def metric(k: int, t: float) -> dict:
    """Line k of trainer_log.jsonl as LLaMA-Factory's LogCallback writes it (json.dumps)."""
    raw = {
        "current_steps": k + 1,
        "total_steps": 10**6,
        "loss": round(2.0 - k * 1e-5, 4),
        "lr": 1e-4,
        "epoch": round(k / 5000, 2),
        "percentage": round((k + 1) / 10**4, 2),
        "elapsed_time": f"{k // 3600}:{k // 60 % 60:02d}:{k % 60:02d}",
        "remaining_time": "9:00:00",
        "throughput": 1234.5,
        "total_tokens": 4096 * (k + 1),
    }
    return {"line": k, "t": t, "raw": json.dumps(raw)}


async def post(client: httpx.AsyncClient, r: Runner, batch: dict) -> bool:
    content, kind = packed_body(batch)
    resp = await client.post(
        f"/api/jobs/{r.job}/telemetry",
        content=content,
        headers={"Authorization": f"Bearer {r.token}", "X-Tunedeck": "1", "Content-Type": kind},
    )
    if resp.status_code != 200:
        print(f"refused: {resp.status_code} {resp.text[:200]}", file=sys.stderr)
    return resp.status_code == 200


async def play(client, r: Runner, t0: float, start: int, stop: int, stats: dict, sent: dict) -> None:
    """At 1 Hz (at the runner's phase) from second `start` to `stop` of t0: each second's samples, or
    every second missed while the last POST was waiting."""
    while True:
        k = math.floor(time.time() - t0 - r.phase) + 1  # seconds sampled by now
        if k > stop:
            return
        if k <= r.tick:
            await asyncio.sleep(t0 + r.phase + r.tick - time.time() + 0.002)
            continue
        batch = r.body(k, t0)
        began = time.time()
        if r.first:  # each line's step, at the time the line was written (its second)
            for s in range(r.tick, k):
                sent.setdefault((r.job, s + 1), r.t(t0, s))
        spiked = [(r.job, r.node, r.spikes[s], r.t(t0, s)) for s in range(r.tick, k) if s in r.spikes]
        t_perf = time.perf_counter()
        try:
            ok = await post(client, r, batch)
        except httpx.HTTPError:
            ok = False
        stats["post_ms"].append(1000 * (time.perf_counter() - t_perf))
        stats.setdefault("first", {}).setdefault(r.node, stats["post_ms"][-1])
        if ok:
            stats["acked"] += 1
            r.seq, r.tick = r.seq + 1, k
            for key in spiked:
                stats["spikes"].setdefault(key, began)
        else:
            stats["errors"] += 1


async def spike_watch(db: Path, stats: dict, stop: asyncio.Event, alerted: dict) -> None:
    """Each injected spike's alert: a spike row of its device whose newest occurrence is its sample
    (read from the database file, read-only, every 50 ms; a spike already seen counts once)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30, check_same_thread=False)
    with closing(conn):
        while not stop.is_set():
            if stats["spikes"]:
                rows = await asyncio.to_thread(
                    lambda: conn.execute(
                        "SELECT job_id, node, gpu, t FROM alerts WHERE kind IN "
                        "('vram_spike', 'vram_periodic_spikes')"
                    ).fetchall()
                )
                now = time.time()
                for job, node, gpu, t in rows:
                    key = (job, node, gpu, round(t, 3))
                    if key in stats["spikes"] and key not in alerted:
                        alerted[key] = now
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- the viewers' process
async def _sse(port: int, path: str, on_event, stop: asyncio.Event, counts: dict) -> None:
    """A raw SSE client (a browser's EventSource, lighter): `on_event(data, arrival)` per event."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"{path}: {head[:200]!r}")
    counts["connected"] += 1
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


async def _lag(stop: asyncio.Event, out: list) -> None:
    """How late a 10 ms timer fires on this event loop (ms)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        out.append(1000 * (time.perf_counter() - t - 0.01))


async def _wal_peak(wal: Path, stop: asyncio.Event, out: list) -> None:
    """The WAL file's largest size seen (MiB), read every half second."""
    while not stop.is_set():
        out.append(wal.stat().st_size / 2**20 if wal.exists() else 0.0)
        await asyncio.sleep(0.5)


async def _viewers(port: int, n: int, job_paths: list[str], ready, finish, results) -> None:
    stop = asyncio.Event()
    counts = {"connected": 0}
    team: list[dict[int, list]] = [{} for _ in range(min(n, PARSED))]  # per viewer: job -> [(step, t)]
    jobs: list[tuple[float, float]] = []  # (line t, arrival) of each metrics point

    def team_viewer(mine: dict[int, list]):
        def on_event(ev: bytes, now: float) -> None:
            for job, step in ROW.findall(ev):
                seen = mine.setdefault(int(job), [])
                if not seen or int(step) > seen[-1][0]:
                    seen.append((int(step), now))

        return on_event

    def on_job(ev: bytes, now: float) -> None:
        if b"event: metrics" in ev:
            for line in ev.split(b"\r\n"):
                if line.startswith(b"data: "):
                    jobs.extend((p["t"], now) for p in json.loads(line[6:]))

    lag: list[float] = []
    tasks = [
        asyncio.create_task(
            _sse(port, "/api/stream", team_viewer(team[i]) if i < PARSED else None, stop, counts)
        )
        for i in range(n)
    ] + [asyncio.create_task(_sse(port, path, on_job, stop, counts)) for path in job_paths]
    while counts["connected"] < len(tasks) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.1)
    for t in tasks:
        if t.done() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]  # (checked just above)
    ready.set()
    ticker = asyncio.create_task(_lag(stop, lag))
    cpu0 = time.process_time()
    while not finish.is_set():
        await asyncio.sleep(0.1)
    cpu = time.process_time() - cpu0
    stop.set()
    for t in [*tasks, ticker]:
        t.cancel()
    await asyncio.gather(*tasks, ticker, return_exceptions=True)
    results.put({"team": team, "jobs": jobs, "lag": lag, "cpu": cpu})


def viewers_main(port: int, n: int, job_paths: list[str], ready, finish, results) -> None:
    """The viewers' process: team and job streams, read until `finish`; what they saw into `results`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(_viewers(port, n, job_paths, ready, finish, results))


# ---------------------------------------------------------------------- one server
def tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def hidden(names: str, ws: Path) -> str:
    """A folder whose modules `names` (comma-separated) fail to import, to put first on a server's path:
    a revision from before a dependency was declared runs as it did then (uvicorn takes uvloop and
    httptools whenever they import)."""
    folder = ws / "hidden"
    folder.mkdir(parents=True, exist_ok=True)
    for name in filter(None, names.split(",")):
        (folder / f"{name.strip()}.py").write_text('raise ImportError("hidden by bench/cluster_shape.py")\n')
    return f"{folder}:"


async def measure(code: Path, args, label: str, hide: str = "") -> dict:
    """One server on `code`'s backend, the cluster played against it (`hide`: modules it cannot import)."""
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-cluster-"))
    path = (hidden(hide, ws) if hide else "") + f"{code}/backend:{code}/trainer"
    server = Server(ws / "ws", assets(), TUNEDECK_LAUNCH_PAUSED="true", PYTHONPATH=path).start()
    try:
        return await _measure(server, args, label)
    finally:
        server.stop()


def team_lags(team: list[dict[int, list]], sent: dict, lo: float, hi: float) -> list[float]:
    """Per parsing viewer, each line written in [lo, hi): its time -> the first row at its step or later."""
    out: list[float] = []
    for mine in team:
        for (job, step), t in sent.items():
            if not lo <= t < hi:
                continue
            seen = mine.get(job, [])
            # seen is in step order: the first entry at or past the step
            a, b = 0, len(seen)
            while a < b:
                m = (a + b) // 2
                if seen[m][0] < step:
                    a = m + 1
                else:
                    b = m
            if a < len(seen):
                out.append(1000 * (seen[a][1] - t))
    return out


async def _measure(server: Server, args, label: str) -> dict:
    db = server.workspace / "tunedeck.db"
    rng = random.Random(25)
    runners: list[Runner] = []
    node = 0
    for i, gpus in enumerate(shapes(args.jobs, args.gpus)):
        job = server.submit({"name": f"cl-{i}", "config": demo_config(assets()), "gpus": 0})["id"]
        token = secrets.token_urlsafe(16)
        play_runner(db, job, token, gpus=max(gpus), nodes=len(gpus))
        for n, g in enumerate(gpus):
            runners.append(Runner(job, f"node-{node:02d}", token, n == 0, node, g, rng.random()))
            node += 1
    history_s = int(args.history_h * 3600)
    limits = httpx.Limits(max_connections=len(runners) + 10)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        t0 = float(int(time.time()) - history_s - 1)
        # Each job's history so far, in chunks (the first also starts the ingest store).
        sem = asyncio.Semaphore(4)
        loaded = time.perf_counter()

        async def history(r: Runner) -> None:
            for upto in [*range(HISTORY_CHUNK_S, history_s, HISTORY_CHUNK_S), history_s]:
                if upto <= r.tick:
                    continue
                async with sem:
                    if not await post(client, r, r.body(upto, t0)):
                        raise RuntimeError("a history batch was refused")
                r.seq, r.tick = r.seq + 1, upto

        await asyncio.gather(*(history(r) for r in runners))
        loaded = time.perf_counter() - loaded
    restart = ""
    if args.restart:  # the server stopped and started again on this history: how soon it answers
        server.stop()
        began = time.perf_counter()
        server.start()
        restart = f"healthy {time.perf_counter() - began:.1f} s after its start"
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        cursor = (await client.get("/api/stream/cursor")).json()["cursor"]
        job_paths = [
            f"/api/stream?job={runners[i % len(runners)].job}&cursor={cursor}"
            for i in range(args.job_viewers)
        ]
        ctx = mp.get_context("spawn")
        ready, finish, results = ctx.Event(), ctx.Event(), ctx.Queue()
        viewer_proc = ctx.Process(
            target=viewers_main,
            args=(server.port, args.viewers, job_paths, ready, finish, results),
            daemon=True,
        )
        viewer_proc.start()
        while not ready.is_set():
            if not viewer_proc.is_alive():
                raise RuntimeError("the viewers' process ended before its streams were open")
            await asyncio.sleep(0.2)
        start = math.ceil(time.time() - t0) + 1
        for r in runners:  # the 1 Hz play starts now: the seconds spent on the history are a gap
            r.tick = start
        # Unmeasured seconds first: the alert engine builds each job's detectors from its history.
        warm: dict = {"post_ms": [], "acked": 0, "errors": 0, "spikes": {}}
        await asyncio.gather(*(play(client, r, t0, start, start + args.warm_s, warm, {}) for r in runners))
        if args.restart:  # each runner's first batch after it: stored (answered) at once, or not
            firsts = list(warm["first"].values())
            restart += f"; first batches p50 / max {pct(firsts, 50):.0f} / {max(firsts):.0f} ms"
        start += args.warm_s
        end = start + args.seconds
        for _ in range(args.spikes):  # within the window, not in its last 3 s (their alerts are waited for)
            r = rng.choice(runners)
            r.spikes[rng.randrange(start, max(start + 1, end - 3))] = rng.randrange(r.gpus)
        assert server.proc is not None  # started above
        before, proc = uptime(), psutil.Process(server.proc.pid)
        spy = None
        if args.py_spy:  # where the server's CPU goes in the window: collapsed stacks, its children too
            out = f"{args.py_spy}-{label.replace(' ', '-')}.txt"
            spy = subprocess.Popen(
                [str(Path(args.py_spy_bin or Path(sys.executable).with_name("py-spy"))), "record"]
                + ["--pid", str(proc.pid), "--subprocesses", "--nonblocking", "--duration", str(args.seconds)]
                + ["--rate", "50", "--format", "raw", "--output", out],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        stop = asyncio.Event()
        stats: dict[str, Any] = {"post_ms": [], "acked": 0, "errors": 0, "spikes": {}}
        sent: dict = {}
        alerted: dict = {}
        watcher = asyncio.create_task(spike_watch(db, stats, stop, alerted))
        lag: list[float] = []
        ticker = asyncio.create_task(_lag(stop, lag))
        wal_seen: list[float] = []
        wal_watch = asyncio.create_task(_wal_peak(Path(f"{db}-wal"), stop, wal_seen))
        wal0 = Path(f"{db}-wal").stat().st_size / 2**20 if Path(f"{db}-wal").exists() else 0.0
        cpu0, me0, wall0 = tree_cpu(proc), time.process_time(), time.time()
        await asyncio.gather(*(play(client, r, t0, start, end, stats, sent) for r in runners))
        cpu1, me1, wall1 = tree_cpu(proc), time.process_time(), time.time()
        after = uptime()
        wal = Path(f"{db}-wal")
        wal_mib = wal.stat().st_size / 2**20 if wal.exists() else 0.0
        if spy is not None:
            spy.wait()
        await asyncio.sleep(3)  # the last events and alerts on their way
        finish.set()
        seen = await asyncio.to_thread(results.get, True, 120)
        viewer_proc.join(timeout=30)
        stop.set()
        await asyncio.gather(watcher, ticker, wal_watch)
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            cost = upkeep.day_cost(conn)  # what /api/health's survey says, read the same way
    wall = wall1 - wall0
    devices = sum(r.gpus for r in runners)
    day_gib = (cost["bytes_per_sample"] * devices + cost["bytes_per_point"] * args.jobs) * 86400 / 2**30
    offered = sum(1 for r in runners for k in range(start, end))
    lo, hi = t0 + start, t0 + end
    team_lat = team_lags(seen["team"], sent, lo, hi)
    job_lat = [1000 * (now - t) for t, now in seen["jobs"] if lo <= t < hi]
    spike_lat = [1000 * (alerted[k] - t) for k, t in stats["spikes"].items() if k in alerted]
    return {
        "history loaded": f"{history_s} s a job in {loaded:.0f} s",
        **({"restart": restart} if restart else {}),
        "batches accepted": f"{100 * stats['acked'] / offered:.0f} % of {offered}",
        "POST p50 / p99": f"{pct(stats['post_ms'], 50):.0f} / {pct(stats['post_ms'], 99):.0f} ms",
        "team event p50 / p99": f"{pct(team_lat, 50):.0f} / {pct(team_lat, 99):.0f} ms (n={len(team_lat)})",
        "job event p50 / p99": f"{pct(job_lat, 50):.0f} / {pct(job_lat, 99):.0f} ms (n={len(job_lat)})",
        "spike->alert p50 / p95": f"{pct(spike_lat, 50):.0f} / {pct(spike_lat, 95):.0f} ms "
        f"({len(spike_lat)} of {len(stats['spikes'])} alerted)",
        "server CPU": f"{(cpu1 - cpu0) / wall:.2f} of a core",
        "runners' CPU, lag p99": f"{(me1 - me0) / wall:.2f} core, {pct(lag, 99):.0f} ms",
        "viewers' CPU, lag p99": f"{seen['cpu'] / wall:.2f} core, {pct(seen['lag'], 99):.0f} ms",
        "WAL before / peak / after": f"{wal0:.0f} / {max(wal_seen, default=0):.0f} / {wal_mib:.0f} MiB",
        "a day on disk": f"{day_gib:.1f} GiB ({cost['bytes_per_sample']:.0f} B a sample, "
        f"{cost['bytes_per_point']:.0f} B a line)",
        "errors": str(stats["errors"]),
        "uptime before": before,
        "uptime after": after,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--gpus", type=int, help="GPUs a job (8 a node); default: 8 or 16 filling 512 GPUs")
    ap.add_argument("--viewers", type=int, default=200)
    ap.add_argument("--job-viewers", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--warm-s", type=int, default=10, help="unmeasured seconds at 1 Hz before the window")
    ap.add_argument("--history-h", type=float, default=600 / 3600, help="hours of each job's history first")
    ap.add_argument("--spikes", type=int, default=15, help="one-sample spikes injected in the window")
    ap.add_argument("--restart", action="store_true", help="restart the server after the history")
    ap.add_argument("--py-spy", metavar="PREFIX", help="record each server with py-spy into PREFIX-<run>.txt")
    ap.add_argument("--py-spy-bin", help="the py-spy executable (default: beside this Python)")
    ap.add_argument("--ref", help="a git revision to run the same against first (e.g. HEAD~4, main)")
    ap.add_argument(
        "--ref-hide",
        default="",
        metavar="MODULES",
        help="modules the ref's server cannot import, comma-separated (uvloop,httptools: as before they were dependencies)",
    )
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gpus = sum(map(sum, shapes(args.jobs, args.gpus)))
    print(
        f"{args.jobs} jobs on {gpus} GPUs, 1 Hz, {args.history_h:g} h of history, "
        f"{args.viewers} team viewers, {args.job_viewers} job viewers, {args.spikes} spikes, "
        f"{args.warm_s} s + {args.seconds} s; {os.cpu_count()} CPUs, {uptime()}",
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
                # The pages, presets and migrations the package finds through importlib.resources.
                for name in ("frontend", "configs", "migrations"):
                    link = ref / "backend" / "tunedeck" / name
                    if not link.exists():
                        link.symlink_to(ref / name)
                runs[f"ref {rev}"] = await measure(ref, args, f"ref {rev}", args.ref_hide)
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], check=False
                )
    runs["this tree"] = await measure(ROOT, args, "this tree")
    width = max(len(v) for r in runs.values() for v in r.values())
    print(f"{'':24}" + "".join(f"{name:<{width + 2}}" for name in runs))
    for key in next(iter(runs.values())):
        print(f"{key:24}" + "".join(f"{r[key]:<{width + 2}}" for r in runs.values()))


if __name__ == "__main__":
    asyncio.run(main())

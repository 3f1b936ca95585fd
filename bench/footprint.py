"""Footprint: cold start to the first /api/health, and the server's resident memory idle and under load.

    .venv/bin/python bench/footprint.py --starts 5
    .venv/bin/python bench/footprint.py --starts 5 --load-seconds 15   # also RSS under bench/load.py

Each start is `tunedeck serve` as a subprocess on a temporary workspace (the first on an empty one,
which creates and migrates the database; the rest on that database, as after a restart), timed from
the spawn to the first 200 of /api/health, polled every 10 ms. RSS is read with psutil after the
server has been idle for a few seconds. Under load, bench/load.py runs its 8 one-value-a-row writers
against its own server and reports that server's RSS. Nothing but 127.0.0.1 is contacted.

The server's modules are compiled to bytecode first, as an installed package has them: a checkout run
with PYTHONDONTWRITEBYTECODE (as the test environment is) would compile every module at each start,
~0.15 s that no installed server pays (`--no-compile` measures that too).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

MiB = 1024**2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ws: Path, deadline_s: float = 120.0) -> tuple[subprocess.Popen, str, float, float]:
    """A server on `ws`, the seconds from its spawn to its first healthy answer, and the CPU seconds
    it had used by then (the figure a busy machine inflates least)."""
    port = free_port()
    env = {
        **os.environ,
        "TUNEDECK_WORKSPACE": str(ws),
        "TUNEDECK_PORT": str(port),
        "TUNEDECK_LAUNCH_PAUSED": "true",
    }
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunedeck.cli.main", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.perf_counter() - t0 < deadline_s:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before answering")
            try:
                if client.get("/api/health").status_code == 200:
                    took = time.perf_counter() - t0
                    return proc, url, took, sum(psutil.Process(proc.pid).cpu_times()[:2])
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
    proc.terminate()
    raise RuntimeError(f"no healthy answer within {deadline_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=5, help="cold starts to time")
    ap.add_argument("--idle-s", type=float, default=3.0, help="idle time before reading RSS")
    ap.add_argument("--load-seconds", type=float, default=0, help="also run bench/load.py this long (0: no)")
    ap.add_argument("--no-compile", action="store_true", help="leave the server's modules uncompiled")
    args = ap.parse_args()
    if not args.no_compile:
        for package in ("tunedeck", "tunedeck_train"):  # the copies the server will import (PYTHONPATH)
            spec = importlib.util.find_spec(package)
            if spec and spec.submodule_search_locations:
                compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)
    ws = Path(tempfile.mkdtemp(prefix="tunedeck-footprint-"))
    times, cpu, rss = [], [], []
    for i in range(args.starts):
        proc, url, took, used = start(ws)
        times.append(took)
        cpu.append(used)
        try:
            time.sleep(args.idle_s)
            httpx.get(f"{url}/api/health", timeout=5)
            rss.append(psutil.Process(proc.pid).memory_info().rss / MiB)
        finally:
            stop(proc)
        print(
            f"start {i + 1}{' (new database)' if i == 0 else ''}: first health {took:.2f} s ({used:.2f} s CPU), idle RSS {rss[-1]:.0f} MiB"
        )
    rest = times[1:] or times
    print(
        f"cold start to first /api/health: new database {times[0]:.2f} s; existing database median "
        f"{statistics.median(rest):.2f} s, max {max(rest):.2f} s ({len(rest)} starts); server CPU to it "
        f"median {statistics.median(cpu):.2f} s; load average {os.getloadavg()[0]:.1f}"
        f"{'; modules not compiled beforehand' if args.no_compile else ''}"
    )
    print(f"idle RSS: median {statistics.median(rss):.0f} MiB, max {max(rss):.0f} MiB")
    if args.load_seconds:
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("load.py")),
                "--shape",
                "memory",
                "--runners",
                "8",
                "--viewers",
                "0",
                "--seconds",
                str(args.load_seconds),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        print("under bench/load.py, 8 writers, one value a row:")
        print("\n".join("  " + line for line in out.splitlines()))


if __name__ == "__main__":
    main()

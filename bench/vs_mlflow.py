"""tunedeck next to an MLflow 3 tracking server (SQLite store), on the same data, in one run.

    .venv/bin/python bench/vs_mlflow.py [--seconds 8] [--series 1000000] [--mlflow-workers 4]

MLflow goes into its own venv (bench/.venv-mlflow, from the package index, once); when it cannot be
installed the script says so and stops. Both servers run here on temporary stores, on 127.0.0.1
only, and both are fed over their own HTTP APIs by one writer (tunedeck: runner batches; MLflow:
runs/log-batch, at most 1000 metrics a call), then the table is printed with ratios:

- ingest of LLaMA-Factory lines (7 values a line) and of one value a row (memory samples), 1 writer;
- acknowledged -> stored: after the last acknowledged call, how long until the store holds it all;
- the first chart read of a 1M-point series, 2000 points out (tunedeck: the memory chart; MLflow:
  get-history-bulk-interval, its own sampling for charts), and whether a one-sample spike survives.
  MLflow's series is written into its SQLite store directly (its API would take minutes);
- trainer_log line -> live event: tunedeck from bench/live_latency.py (a real runner); MLflow has
  no push, a page polls;
- server RSS (the whole process tree), peak over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import add_dataset, play_runner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv-mlflow"
MiB = 2**20
LF_KEYS = ("loss", "lr", "epoch", "throughput", "total_tokens", "vram_allocated", "vram_reserved")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_bin() -> Path | None:
    """The venv's `mlflow`, installing it the first time; None (with a message) when that fails."""
    exe = VENV / "bin" / "mlflow"
    ok = lambda: (
        exe.exists() and subprocess.run([VENV / "bin" / "python", "-c", "import mlflow"]).returncode == 0
    )
    if ok():
        return exe
    print(f"installing mlflow 3 into {VENV} ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([VENV / "bin" / "pip", "install", "-q", "mlflow>=3,<4"], check=True, timeout=1800)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"skipped: mlflow could not be installed ({e})")
        return None
    return exe if ok() else None


def wait_up(url: str, proc: subprocess.Popen, path: str, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    with httpx.Client(timeout=5) as c:
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"{url}: server exited with {proc.returncode}")
            try:
                if c.get(url + path).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise SystemExit(f"{url}: not up after {timeout:.0f} s")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a server and its child processes (tunedeck's ingest store) so far. A child that
    started meanwhile counts whole, start-up included: the figure errs high."""
    root = psutil.Process(pid)
    total = 0.0
    for p in (root, *root.children(recursive=True)):
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


class Tree:
    """Peak RSS of a server's whole process tree, sampled in the background."""

    def __init__(self, pid: int):
        self.proc, self.peak, self._stop = psutil.Process(pid), 0.0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def rss(self) -> float:
        procs = [self.proc, *self.proc.children(recursive=True)]
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / MiB

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.Error:
                return
            self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()


# ------------------------------------------------------------------ tunedeck
class Tunedeck:
    def __init__(self, ws: Path):
        self.ws, self.port = ws, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "TUNEDECK_WORKSPACE": str(ws),
            "TUNEDECK_PORT": str(self.port),
            "TUNEDECK_LAUNCH_PAUSED": "true",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck.cli.main", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.start_s = wait_up(self.url, self.proc, "/api/health")
        self.api = httpx.Client(base_url=self.url, timeout=120, headers={"X-Tunedeck": "1"})
        (ws / "models" / "m").mkdir(parents=True)
        add_dataset(ws / "data")  # the "d" the jobs name: a submit refuses a dataset it cannot find

    def job(self, name: str) -> tuple[int, dict]:
        r = self.api.post(
            "/api/jobs",
            json={
                "name": name,
                "gpus": 0,
                "config": {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen"},
            },
        )
        r.raise_for_status()
        job, token = r.json()["id"], secrets.token_urlsafe(16)
        with sqlite3.connect(self.ws / "tunedeck.db", timeout=60) as db:  # the bench plays the runner
            play_runner(db, job, token)
        return job, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, job: int, headers: dict, body: bytes) -> None:
        r = self.api.post(f"/api/jobs/{job}/telemetry", content=body, headers=headers)
        r.raise_for_status()

    def count(self, sql: str, *args) -> int:
        with sqlite3.connect(f"file:{self.ws / 'tunedeck.db'}?mode=ro", uri=True, timeout=60) as db:
            return db.execute(sql, args).fetchone()[0]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def lf_lines(first: int, n: int, t0: float) -> list[dict]:
    out = []
    for i in range(first, first + n):
        v = {
            "current_steps": i,
            "total_steps": 10**7,
            "loss": 2.0 / (1 + i) ** 0.3,
            "lr": 1e-4,
            "epoch": i / 1e5,
        }
        v |= {
            "throughput": 5000.0 + i % 97,
            "total_tokens": 512 * i,
            "vram_allocated": 41.5,
            "vram_reserved": 43.0,
        }
        out.append({"line": i, "t": t0 + i / 10, "raw": json.dumps(v)})
    return out


def memory_body(seq: int, first: int, used: list[int], t0: float) -> bytes:
    """Samples packed as a runner packs them (tunedeck.contract.wire)."""
    from tunedeck.contract import wire

    lines = range(first, first + len(used))
    cols = {
        "line": list(lines),
        "t": [t0 + i for i in lines],
        "gpu": [0] * len(used),
        "used_bytes": used,
        "total_bytes": [206158430208] * len(used),
    }
    return wire.encode({"seq": seq, "memory": cols})


def series_values(n: int, spike_at: int) -> list[int]:
    """A noisy flat line with one sample far above it: what a chart must not drop."""
    v = [40_000_000_000 + (i * 7919) % 1_000_000_000 for i in range(n)]
    v[spike_at] = 90_000_000_000
    return v


# ------------------------------------------------------------------ MLflow
class MLflow:
    def __init__(self, exe: Path, tmp: Path, workers: int):
        self.db, self.port = tmp / "mlflow.db", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(exe),
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.db}",
                "--default-artifact-root",
                str(tmp / "mlflow-artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.start_s = wait_up(self.url, self.proc, "/health")
        self.api = httpx.Client(base_url=self.url, timeout=300)
        r = self.api.post(
            "/api/2.0/mlflow/experiments/create", json={"name": f"bench-{uuid.uuid4().hex[:8]}"}
        )
        r.raise_for_status()
        self.experiment = r.json()["experiment_id"]

    def _post(self, path: str, body: dict) -> httpx.Response:
        for attempt in range(6):  # a worker that drops a connection (a busy machine) gets retries
            try:
                r = self.api.post(path, json=body)
                r.raise_for_status()
                return r
            except httpx.TransportError:
                if attempt == 5:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def run(self) -> str:
        body = {"experiment_id": self.experiment, "start_time": int(time.time() * 1000)}
        return self._post("/api/2.0/mlflow/runs/create", body).json()["run"]["info"]["run_id"]

    def log(self, run: str, metrics: list[dict]) -> None:
        self._post("/api/2.0/mlflow/runs/log-batch", {"run_id": run, "metrics": metrics})

    def count(self, run: str, key: str) -> int:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=60) as db:
            return db.execute(
                "SELECT count(*) FROM metrics WHERE run_uuid=? AND key=?", (run, key)
            ).fetchone()[0]

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)


# ------------------------------------------------------------------ the measures
def counted(n: int, send: Callable[[int], None]) -> Callable[[int], int]:
    """A step for `timed` that sends n values."""

    def step(k: int) -> int:
        send(k)
        return n

    return step


def timed(seconds: float, cap: int, step) -> tuple[int, float, float]:
    """Calls step() (returns values it sent) until `seconds` or `cap` values; (values, wall s, last ack)."""
    sent, t0 = 0, time.perf_counter()
    ack = time.time()
    while time.perf_counter() - t0 < seconds and sent < cap:
        sent += step(sent)
        ack = time.time()
    return sent, time.perf_counter() - t0, ack


def until_stored(count, want: int, ack: float, timeout: float = 600) -> float:
    """Seconds from the last ack to the first poll (every 20 ms) that finds all `want` values stored."""
    deadline = time.time() + timeout
    while count() < want:
        if time.time() > deadline:
            return float("nan")
        time.sleep(0.02)
    return max(0.0, time.time() - ack)


def live_latency() -> str:
    """p50/p95 of trainer_log line -> SSE event, from bench/live_latency.py (its own server and runner)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "live_latency.py"), "--lines", "80", "--interval", "0.15"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    m = re.search(r"SSE client : n=\d+ median=(\d+)ms p95=(\d+)ms", out.stdout)
    return f"p50 {m[1]} ms, p95 {m[2]} ms" if m else f"not measured ({(out.stderr or out.stdout)[-200:]!r})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="each ingest measure runs this long at most")
    ap.add_argument("--series", type=int, default=1_000_000, help="points of the chart-read series")
    ap.add_argument("--mlflow-workers", type=int, default=4, help="MLflow's default is 4")
    ap.add_argument("--no-live", action="store_true", help="skip the trainer_log -> event measure")
    args = ap.parse_args()
    exe = mlflow_bin()
    if exe is None:
        return
    tmp = Path(tempfile.mkdtemp(prefix="tunedeck-vs-mlflow-"))
    td = Tunedeck(tmp / "ws")
    ml = MLflow(exe, tmp, args.mlflow_workers)
    td_rss, ml_rss = Tree(td.proc.pid), Tree(ml.proc.pid)
    idle = (td_rss.rss(), ml_rss.rss())
    rows: list[tuple[str, str, str, str]] = []
    t0 = time.time()
    try:
        # 1. LLaMA-Factory lines, 7 values each.
        job, hd = td.job("lines")
        seq = iter(range(10**9))
        n_td, s_td, _ = timed(
            args.seconds,
            10**9,
            counted(
                200 * 7,
                lambda k: td.post(
                    job, hd, json.dumps({"seq": next(seq), "metrics": lf_lines(k // 7, 200, t0)}).encode()
                ),
            ),
        )
        run = ml.run()

        def ml_lines(k: int) -> int:
            lines = lf_lines(k // 7, 142, t0)
            ml.log(
                run,
                [
                    {
                        "key": key,
                        "value": float(json.loads(x["raw"])[key]),
                        "timestamp": int(x["t"] * 1000),
                        "step": x["line"],
                    }
                    for x in lines
                    for key in LF_KEYS
                ],
            )
            return 142 * 7

        n_ml, s_ml, _ = timed(args.seconds, 10**9, ml_lines)
        a, b = n_td / s_td, n_ml / s_ml
        rows.append(
            (
                "ingest, LF lines (7 values a line), 1 writer",
                f"{a:,.0f} values/s",
                f"{b:,.0f}",
                f"{a / b:.1f}x",
            )
        )

        # 2. One value a row, and acknowledged -> stored.
        job, hd = td.job("memory")
        hd = {**hd, "Content-Type": "application/vnd.tunedeck.batch"}
        cap = 200_000
        seq = iter(range(10**9))
        cpu0 = tree_cpu(td.proc.pid)
        flat = series_values(2000, 0)[1:] + [40_000_000_000]
        n_td, s_td, ack_td = timed(
            args.seconds * 3,
            cap,
            counted(2000, lambda k: td.post(job, hd, memory_body(next(seq), k, flat, t0))),
        )
        cpu_td = tree_cpu(td.proc.pid) - cpu0
        lag_td = until_stored(
            lambda: td.count("SELECT count(*) FROM memory_samples WHERE job_id=?", job), n_td, ack_td
        )
        run = ml.run()
        n_ml, s_ml, ack_ml = timed(
            args.seconds,
            cap,
            counted(
                1000,
                lambda k: ml.log(
                    run,
                    [
                        {
                            "key": "gpu0_used",
                            "value": float(40e9 + i),
                            "timestamp": int((t0 + i) * 1000),
                            "step": i,
                        }
                        for i in range(k, k + 1000)
                    ],
                ),
            ),
        )
        lag_ml = until_stored(lambda: ml.count(run, "gpu0_used"), n_ml, ack_ml)
        a, b = n_td / s_td, n_ml / s_ml
        rows.append(
            (
                "ingest, one value a row, 1 writer",
                f"{a:,.0f} values/s, {1e6 * cpu_td / max(1, n_td):.1f} µs CPU a value",
                f"{b:,.0f}",
                f"{a / b:.1f}x",
            )
        )
        rows.append(
            (
                "acknowledged -> stored (one value a row)",
                f"{lag_td:.2f} s behind ({n_td:,} values)",
                f"{lag_ml:.2f} s ({n_ml:,} values)",
                "ack = commit" if lag_td < 0.1 else "",
            )
        )

        # 3. First chart read of a long series, 2000 points out; is the spike kept?
        n, spike_at = args.series, args.series * 2 // 3 + 17
        values = series_values(n, spike_at)
        job, hd = td.job("series")
        hd = {**hd, "Content-Type": "application/vnd.tunedeck.batch"}
        for k in range(0, n, 5000):
            td.post(job, hd, memory_body(k // 5000, k, values[k : k + 5000], t0))
        run = ml.run()
        ml.log(
            run, [{"key": "gpu0_used", "value": 0.0, "timestamp": int(t0 * 1000), "step": 0}]
        )  # the key exists
        with sqlite3.connect(ml.db, timeout=60) as db:
            db.execute("DELETE FROM metrics WHERE run_uuid=?", (run,))
            db.executemany(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES ('gpu0_used', ?, ?, ?, ?, 0)",
                ((float(v), int((t0 + i) * 1000), run, i) for i, v in enumerate(values)),
            )
            db.execute(
                "UPDATE latest_metrics SET value=?, timestamp=?, step=? WHERE run_uuid=? AND key='gpu0_used'",
                (float(values[-1]), int((t0 + n - 1) * 1000), n - 1, run),
            )

        def td_read() -> tuple[float, bool, int]:
            s = time.perf_counter()
            r = td.api.get(f"/api/jobs/{job}/memory", params={"gpu": 0, "max_points": 2000, "limit": 20000})
            r.raise_for_status()
            got = [m["used_bytes"] for m in r.json()["samples"]]
            return time.perf_counter() - s, max(values) in got, len(got)

        def ml_read() -> tuple[float, bool, int]:
            s = time.perf_counter()
            r = ml.api.get(
                "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval",
                params={"run_ids": run, "metric_key": "gpu0_used", "max_results": 2000},
            )
            r.raise_for_status()
            got = [m["value"] for m in r.json().get("metrics", [])]
            return time.perf_counter() - s, float(max(values)) in got, len(got)

        (a, kept_a, na), (b, kept_b, nb) = td_read(), ml_read()
        (a2, *_), (b2, *_) = td_read(), ml_read()
        spike = lambda kept: "spike kept" if kept else "spike lost"
        rows.append(
            (
                f"first chart read, {n:,}-point series ({na}/{nb} points out)",
                f"{a * 1000:.0f} ms, {spike(kept_a)}; repeat {a2 * 1000:.0f} ms",
                f"{b * 1000:.0f} ms, {spike(kept_b)}; repeat {b2 * 1000:.0f} ms",
                f"{b / a:.1f}x",
            )
        )

        # 4. trainer_log line -> live event.
        if not args.no_live:
            rows.append(("trainer_log line -> live event", live_latency(), "no push (a page polls)", ""))
        rows.append(
            (
                "server RSS (process tree): idle / peak",
                f"{idle[0]:.0f} / {td_rss.peak:.0f} MiB",
                f"{idle[1]:.0f} / {ml_rss.peak:.0f} MiB ({args.mlflow_workers} workers)",
                f"{ml_rss.peak / td_rss.peak:.1f}x less",
            )
        )
        rows.append(("start to first health answer", f"{td.start_s:.1f} s", f"{ml.start_s:.1f} s", ""))
    finally:
        td_rss.stop()
        ml_rss.stop()
        td.stop()
        ml.stop()
    mlflow_version = subprocess.run(
        [VENV / "bin" / "python", "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(
        f"\ntunedeck vs MLflow {mlflow_version} (SQLite store), this machine, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| | tunedeck | MLflow | ratio |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()

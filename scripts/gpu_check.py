"""The Python half of scripts/gpu_check.sh: the demo model through tunedeck at two sampling rates, then a report.

    python scripts/gpu_check.py [--cpu] [--steps N] [--workspace DIR] [--rates 1,0.1]

For each rate a `tunedeck serve` starts on a free port over one workspace, with
TUNEDECK_MEMORY_SAMPLE_S set to it, and runs the demo preset on one GPU (or the CPU with --cpu).
Printed per run: the sampled memory curve (bucket maxima, so peaks survive) beside LLaMA-Factory's
RECORD_VRAM peaks (`vram_allocated`/`vram_reserved` of trainer_log.jsonl, GiB since process
start), the stored estimate against the measured peak, the GPU's readings as `/api/nodes` gives
them (power, temperatures, the processes on it with their VRAM) beside `nvidia-smi`'s own answer
taken at the same moment, and at the end the sampler's own CPU cost. Exits non-zero when a run
does not succeed or a reading disagrees with nvidia-smi (power or temperature missing where
nvidia-smi has one, the trainer not among the GPU's processes, its VRAM off by more than
VRAM_SLACK). On the CPU the node check asks that `/api/nodes` answers with this host.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30
MiB = 1 << 20
TEMP_SLACK_C = 5.0  # two reads a moment apart: a GPU under load moves a few degrees
POWER_SLACK = 0.5  # power moves fast under load: only a reading of another scale is wrong
VRAM_SLACK = 0.05  # of the process's VRAM, or 64 MiB, whichever is more
CPU_ONLY_KEYS = (
    "use_cpu",
    "no_cuda",
    "use_mps_device",
)  # the demo preset must not pin the GPU run to the CPU


class Failed(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`tunedeck serve` in a subprocess; its log stays in the workspace."""

    def __init__(self, workspace: Path, *, rate: float, gpu: bool):
        self.workspace, self.port = workspace, free_port()
        self.env = {
            **os.environ,
            "TUNEDECK_WORKSPACE": str(workspace),
            "TUNEDECK_PORT": str(self.port),
            "TUNEDECK_HOST": "127.0.0.1",
            "TUNEDECK_MEMORY_SAMPLE_S": str(rate),
            "TUNEDECK_TRAIN_PYTHON": sys.executable,
            "TUNEDECK_GPU_SLOTS": "1" if gpu else "0",
            "TUNEDECK_SCHEDULER_INTERVAL_S": "0.3",
            "PYTHONUNBUFFERED": "1",
        }
        self.log = workspace / f"server-{rate:g}s.log"
        # X-Tunedeck: the open mode's guard against cross-site forms (api/guard.py) asks every write for it.
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", timeout=60, headers={"X-Tunedeck": "1"}
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tunedeck.cli.main", "serve"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"the server exited with {self.proc.returncode}:\n{tail(self.log)}")
            try:
                if self.api.get("/api/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise Failed(f"the server did not answer within 90 s:\n{tail(self.log)}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def pages(self, path: str, key: str) -> list[dict]:
        out: list[dict] = []
        after = None
        while True:
            r = self.api.get(path, params={"limit": 20000, **({"after": after} if after is not None else {})})
            r.raise_for_status()
            page = r.json()
            if not page[key]:
                return out
            out += page[key]
            after = page["next"]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def job_spec(rate: float, *, gpu: bool, steps: int) -> dict:
    config = yaml.safe_load((ROOT / "configs" / "demo_cpu.yaml").read_text())
    for key in CPU_ONLY_KEYS:
        config.pop(key, None)
    config.update(
        {
            "max_steps": steps,
            "save_steps": steps,
            "eval_steps": max(1, steps // 2),
            "logging_steps": max(1, steps // 60),
        }
    )
    return {
        "name": f"gpu check {rate:g}s" if gpu else f"cpu check {rate:g}s",
        "config": config,
        "gpus": int(gpu),
    }


def run_once(workspace: Path, rate: float, *, gpu: bool, steps: int, timeout: float) -> dict:
    server = Server(workspace, rate=rate, gpu=gpu)
    try:
        server.start()
        r = server.api.post("/api/jobs", json=job_spec(rate, gpu=gpu, steps=steps))
        if r.status_code != 201:
            raise Failed(f"submission refused ({r.status_code}): {r.text}")
        job_id = r.json()["id"]
        nodes = node_check(server, job_id, gpu=gpu, timeout=timeout)
        if not wait_done(server, job_id, timeout):
            print(
                f"gpu_check: job {job_id} still running after {timeout:.0f} s: cancelling it", file=sys.stderr
            )
            server.api.post(f"/api/jobs/{job_id}/cancel")
            wait_done(server, job_id, 60)
        job = server.api.get(f"/api/jobs/{job_id}").json()
        return {
            "rate": rate,
            "job": job,
            "memory": server.pages(f"/api/jobs/{job_id}/memory", "samples"),
            "metrics": server.pages(f"/api/jobs/{job_id}/metrics", "points"),
            "estimate": server.api.get(f"/api/jobs/{job_id}/estimate").json(),
            "logs": [x["text"] for x in server.pages(f"/api/jobs/{job_id}/logs", "lines")[-15:]],
            "nodes": nodes,
        }
    finally:
        server.stop()


def nvidia_smi(query: str, fields: str) -> list[list[str]]:
    """nvidia-smi's CSV answer to --query-<query>=<fields>, one list of values per row; [] without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]


def number(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def node_check(server: Server, job_id: int, *, gpu: bool, timeout: float) -> dict:
    """Once the job's trainer holds memory, `/api/nodes` and nvidia-smi a moment apart: per GPU
    power, temperature and the processes with their VRAM. {"rows": printable lines, "problems": [...]}."""
    rows: list[str] = []
    problems: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        job = server.api.get(f"/api/jobs/{job_id}").json()
        nodes = server.api.get("/api/nodes").json()
        gpus = [g for n in nodes for g in n["gpus"]]
        held = [g for g in gpus if any(p.get("job_id") == job_id for p in g["processes"])]
        if job["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        if (not gpu and nodes and job["status"] == "running") or held:
            break
        time.sleep(0.5)
    if not nodes:
        problems.append("/api/nodes lists no node")
    if not gpu:
        rows.append(
            f"node {nodes[0]['name'] if nodes else '-'}: backend {nodes[0]['backend'] if nodes else '-'}"
        )
        return {"rows": rows, "problems": problems}
    smi = {r[0]: r for r in nvidia_smi("gpu", "pci.bus_id,power.draw,temperature.gpu,memory.used")}
    apps = nvidia_smi("compute-apps", "gpu_bus_id,pid,used_memory")
    if not held:
        problems.append(f"no GPU in /api/nodes lists a process of job {job_id} (job {job['status']})")
    for g in held or gpus:
        bus = (g.get("bus_id") or "").lower()
        mine = next((r for k, r in smi.items() if k.lower().endswith(bus[-12:])), None) if bus else None
        rows.append(
            f"GPU {g['index']} {bus or '?'}: power {g.get('power_w')} W, temp {g.get('temp_c')} C, "
            f"junction {g.get('temp_junction_c')} C, hbm {g.get('temp_hbm_c')} C, clock {g.get('clock_mhz')} MHz, "
            f"ECC {g.get('ecc_correctable')}/{g.get('ecc_uncorrectable')}, throttle {g.get('throttle')}"
        )
        if mine is None:
            rows.append("   nvidia-smi: no GPU of this bus id (an AMD machine: compare with amd-smi by eye)")
            continue
        power, temp = number(mine[1]), number(mine[2])
        rows.append(f"   nvidia-smi: power {mine[1]} W, temp {mine[2]} C, memory.used {mine[3]} MiB")
        if power is not None:
            if g.get("power_w") is None:
                problems.append(f"GPU {g['index']}: no power reading, nvidia-smi says {power} W")
            elif abs(g["power_w"] - power) > POWER_SLACK * max(power, 1.0):
                problems.append(f"GPU {g['index']}: power {g['power_w']} W, nvidia-smi {power} W")
        if temp is not None:
            if g.get("temp_c") is None:
                problems.append(f"GPU {g['index']}: no temperature, nvidia-smi says {temp} C")
            elif abs(g["temp_c"] - temp) > TEMP_SLACK_C:
                problems.append(f"GPU {g['index']}: temperature {g['temp_c']} C, nvidia-smi {temp} C")
        theirs = {
            int(a[1]): number(a[2]) for a in apps if a[0].lower().endswith(bus[-12:]) and a[1].isdigit()
        }
        for p in g["processes"]:
            smi_mib = theirs.get(p["pid"])
            ours = p.get("vram_bytes")
            rows.append(
                f"   pid {p['pid']} {p.get('name')} job {p.get('job_id')}: "
                f"{'-' if ours is None else f'{ours / MiB:.0f}'} MiB, nvidia-smi "
                f"{'-' if smi_mib is None else f'{smi_mib:.0f}'} MiB"
            )
            if p.get("job_id") == job_id and smi_mib is not None:
                if ours is None:
                    problems.append(f"GPU {g['index']}: pid {p['pid']} has no VRAM reading")
                elif abs(ours - smi_mib * MiB) > max(VRAM_SLACK * smi_mib * MiB, 64 * MiB):
                    problems.append(
                        f"GPU {g['index']}: pid {p['pid']} {ours / MiB:.0f} MiB, nvidia-smi {smi_mib:.0f}"
                    )
        missing = [pid for pid in theirs if pid not in {p["pid"] for p in g["processes"]}]
        if missing:
            problems.append(f"GPU {g['index']}: nvidia-smi lists pids {missing} that /api/nodes does not")
    return {"rows": rows, "problems": problems}


def wait_done(server: Server, job_id: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while server.api.get(f"/api/jobs/{job_id}").json()["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.3f}"


def report(run: dict, buckets: int = 20) -> None:
    job, memory, metrics = run["job"], run["memory"], run["metrics"]
    print(
        f"\n== TUNEDECK_MEMORY_SAMPLE_S={run['rate']:g}: job {job['id']} {job['status']}"
        f"{' (' + str(job['error']) + ')' if job['error'] else ''}"
    )
    if not memory:
        print("   no memory samples stored")
        return
    t_all = [s["t"] for s in memory] + [p["t"] for p in metrics]
    t0, t1 = min(t_all), max(t_all)
    for gpu in sorted({s["gpu"] for s in memory}):
        series = sorted((s for s in memory if s["gpu"] == gpu), key=lambda s: s["t"])
        span = series[-1]["t"] - series[0]["t"]
        total = next((s["total_bytes"] for s in series if s["total_bytes"]), None)
        print(
            f"   {'host memory' if gpu < 0 else f'GPU {gpu}'}: {len(series)} samples over {span:.1f} s "
            f"({(len(series) - 1) / span if span > 0 else 0:.2f}/s), total {gib(total)} GiB"
        )
        print(f"   {'t (s)':>7} {'used GiB (max)':>15} {'RECORD_VRAM alloc':>18} {'reserved':>9} {'step':>6}")
        width = (t1 - t0) / buckets or 1.0
        for b in range(buckets):
            lo, hi = t0 + b * width, t0 + (b + 1) * width
            inside = [
                s["used_bytes"] for s in series if lo <= s["t"] < hi or (b == buckets - 1 and s["t"] == t1)
            ]
            seen = [p for p in metrics if p["t"] < hi]  # RECORD_VRAM values are peaks since process start
            last = seen[-1] if seen else {}
            alloc, res = last.get("vram_allocated"), last.get("vram_reserved")
            print(
                f"   {lo - t0:>7.1f} {gib(max(inside)) if inside else '':>15} "
                f"{'-' if alloc is None else f'{alloc:.3f}':>18} {'-' if res is None else f'{res:.3f}':>9} "
                f"{last.get('step') if last.get('step') is not None else '-':>6}"
            )
        peak = max(series, key=lambda s: s["used_bytes"])
        reserved = max((p["vram_reserved"] or 0.0 for p in metrics), default=0.0) * GiB
        allocated = max((p["vram_allocated"] or 0.0 for p in metrics), default=0.0) * GiB
        print(
            f"   peak sampled {gib(peak['used_bytes'])} GiB at t={peak['t'] - t0:.1f} s; RECORD_VRAM peaks: "
            f"reserved {gib(reserved)} GiB, allocated {gib(allocated)} GiB"
        )
        if reserved:
            print(
                f"   sampled - reserved = {gib(peak['used_bytes'] - reserved)} GiB (driver context and memory "
                "outside torch's caching allocator)"
            )
    est = run["estimate"]
    predicted = (est.get("estimate") or {}).get("per_gpu_bytes")
    measured = est.get("measured") or {}
    ratio = f"{est['ratio']:.2f}" if est.get("ratio") is not None else "-"
    print(
        f"   estimate: predicted {gib(predicted)} GiB per GPU, measured {gib(measured.get('bytes'))} GiB "
        f"({measured.get('source', '-')}, {measured.get('gpu_kind', '-')}): measured / predicted = {ratio}"
    )
    nodes = run["nodes"]
    print("   readings (/api/nodes beside nvidia-smi, while the job ran):")
    for row in nodes["rows"]:
        print(f"   {row}")
    for problem in nodes["problems"]:
        print(f"   DISAGREES: {problem}")
    if job["status"] != "succeeded":
        print("   last output lines:\n      " + "\n      ".join(run["logs"]))


def sampler_cost(gpu: bool, seconds: float) -> int:
    print(f"\n== sampler cost ({seconds:g} s at each rate, bench/sampler_cost.py)", flush=True)
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "sampler_cost.py"),
            "--seconds",
            str(seconds),
            "--backends",
            "gpu,cpu" if gpu else "cpu",
        ],
        check=False,
    ).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cpu", action="store_true", help="run on the CPU (checks the plumbing on a machine without GPU)"
    )
    ap.add_argument(
        "--steps", type=int, default=None, help="max_steps of each run (default 300 on GPU, 20 on CPU)"
    )
    ap.add_argument("--rates", default="1,0.1", help="TUNEDECK_MEMORY_SAMPLE_S of each run, comma-separated")
    ap.add_argument("--workspace", type=Path, default=None, help="default: a new temporary folder")
    ap.add_argument(
        "--job-timeout", type=float, default=150.0, help="seconds one run may take before it is cancelled"
    )
    ap.add_argument("--sampler-seconds", type=float, default=8.0)
    args = ap.parse_args(argv)
    gpu = not args.cpu
    steps = args.steps or (300 if gpu else 20)
    workspace = (args.workspace or Path(tempfile.mkdtemp(prefix="tunedeck-gpu-check-"))).absolute()
    workspace.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"workspace {workspace}; {'one GPU' if gpu else 'CPU'}; {steps} steps per run", flush=True)
    subprocess.run(
        [sys.executable, "-m", "tunedeck_train.demo", "build", "--workspace", str(workspace)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    runs, failed = [], False
    for rate in (float(x) for x in args.rates.split(",")):
        print(f"running the demo at TUNEDECK_MEMORY_SAMPLE_S={rate:g} ...", flush=True)
        try:
            runs.append(run_once(workspace, rate, gpu=gpu, steps=steps, timeout=args.job_timeout))
        except Failed as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            failed = True
    for run in runs:
        report(run)
        failed = failed or run["job"]["status"] != "succeeded" or bool(run["nodes"]["problems"])
    if len(runs) > 1:
        peaks = ", ".join(
            f"{r['rate']:g} s: {gib(max((s['used_bytes'] for s in r['memory']), default=None))} GiB"
            for r in runs
        )
        print(f"\n== peak sampled memory by interval: {peaks}")
    failed = sampler_cost(gpu, args.sampler_seconds) != 0 or failed
    print(
        f"\ngpu_check {'FAILED' if failed else 'done'} in {time.monotonic() - started:.0f} s (logs in {workspace})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

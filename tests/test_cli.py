"""The CLI verbs the README lists, as subprocesses against one real server, with the token from TUNEDECK_TOKEN."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from tests.utils.servers import demo_config, job_processes
from tests.utils.standin import release, training_env
from tests.utils.wait import until


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def submitted_id(r: subprocess.CompletedProcess) -> int:
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.strip().removeprefix("submitted job ").split(" ", 1)
    assert rest.startswith("("), r.stdout
    return int(first)


def test_cli_verbs_against_a_real_server(server_factory, assets, tmp_path):
    ws = tmp_path / "ws"
    base = {**os.environ, "TUNEDECK_WORKSPACE": str(ws)}
    made = cli("token", "create", "--name", "alice", "--role", "submitter", env=base)
    assert made.returncode == 0, made.stderr
    # The demo preset names its model relative to the workspace.
    (ws / "demo").symlink_to(assets / "demo", target_is_directory=True)
    server = server_factory(
        TUNEDECK_OPEN_WRITE="false",
        TUNEDECK_CPU_SLOTS="2",
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_CANCEL_ABORT_GRACE_S="1",
        TUNEDECK_CANCEL_TERM_GRACE_S="1",
        TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")),
    )
    anonymous = {**base, "TUNEDECK_SERVER_URL": server.url}
    alice = {**anonymous, "TUNEDECK_TOKEN": made.stdout.strip()}
    job_yaml = tmp_path / "held.yaml"
    job_yaml.write_text(yaml.safe_dump(demo_config(assets)))

    refused = cli("submit", str(job_yaml), env=anonymous)
    assert refused.returncode == 1 and "401" in refused.stderr, (refused.stdout, refused.stderr)
    assert server.api.get("/api/jobs").json()["jobs"] == []

    held = submitted_id(cli("submit", str(job_yaml), env=alice))  # named after the file: "held"
    run_dir = Path(server.api.get(f"/api/jobs/{held}").json()["run_dir"])
    until(
        lambda: any(x["text"] == "first line" for x in server.all(held, "logs")), "the trainer's first line"
    )
    follow = subprocess.Popen(
        [sys.executable, "-m", "tunedeck.cli.main", "logs", str(held), "--follow"],
        env=alice,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    release(run_dir)
    out, err = follow.communicate(timeout=180)  # --follow returns once the job has ended
    assert follow.returncode == 0, err
    lines = out.splitlines()
    assert lines.index("first line") < lines.index("last line"), out
    assert server.api.get(f"/api/jobs/{held}").json()["status"] == "succeeded"

    preset = submitted_id(cli("submit", "--preset", "demo_cpu", "--name", "from preset", env=alice))
    job = server.api.get(f"/api/jobs/{preset}").json()
    demo = yaml.safe_load((Path(__file__).parents[1] / "configs/demo_cpu.yaml").read_text())
    config = yaml.safe_load(Path(job["run_dir"], "train.yaml").read_text())
    assert config["max_steps"] == demo["max_steps"] and config["dataset"] == demo["dataset"]
    assert config["model_name_or_path"] == str((ws / "demo" / "model").resolve())  # read from the workspace
    server.wait(preset, ("succeeded",), timeout=180)

    listed = cli("jobs", env=alice)
    assert listed.returncode == 0, listed.stderr
    rows = {int(line.split()[0]): line.split()[1] for line in listed.stdout.splitlines()}
    assert rows == {held: "succeeded", preset: "succeeded"}
    shown = cli("show", str(held), env=alice)
    assert shown.returncode == 0, shown.stderr
    shown = json.loads(shown.stdout)
    assert (shown["id"], shown["name"], shown["owner"], shown["status"]) == (
        held,
        "held",
        "alice",
        "succeeded",
    )
    printed = cli("logs", str(preset), env=alice)
    assert printed.returncode == 0, printed.stderr
    steps = [line for line in printed.stdout.splitlines() if line.startswith("stand-in step")]
    assert steps == [f"stand-in step {i}" for i in (1, 2, 3)], printed.stdout

    # What the trainer was started with: offline, RECORD_VRAM, the graceful-stop switch, none of our settings.
    env = json.loads((run_dir / "trainer-env.json").read_text())
    assert (env["HF_HUB_OFFLINE"], env["RECORD_VRAM"], env["LLAMABOARD_ENABLED"]) == ("1", "1", "1")
    assert env["TUNEDECK_JOB_KEY"] == str(run_dir)
    assert [k for k in env if k.startswith("TUNEDECK_") and k != "TUNEDECK_JOB_KEY"] == []
    assert made.stdout.strip() not in json.dumps(env)

    # A trainer that ignores SIGABRT and SIGTERM still ends: the runner escalates to SIGKILL.
    stubborn = submitted_id(cli("submit", str(job_yaml), "--name", "stubborn", env=alice))
    until(
        lambda: any("ignores SIGABRT" in x["text"] for x in server.all(stubborn, "logs")),
        "the stubborn trainer",
    )
    cancelled = cli("cancel", str(stubborn), env=alice)
    assert cancelled.returncode == 0 and cancelled.stdout.split()[0] == str(stubborn), cancelled.stderr
    job = server.wait(stubborn, ("cancelled", "failed", "succeeded"), timeout=180)
    assert (job["status"], job["error"]) == ("cancelled", "killed by SIGKILL"), job
    notes = [x["text"] for x in server.all(stubborn, "logs") if x["stream"] == "runner"]
    sent = [n for n in notes if n.startswith(("cancel requested", "trainer still running"))]
    assert [s.split()[0] if s.startswith("cancel") else s.rsplit(" ", 1)[-1] for s in sent] == [
        "cancel",
        "SIGTERM",
        "SIGKILL",
    ], notes
    assert "SIGABRT" in sent[0]
    assert job_processes(job["run_dir"]) == []
    assert cli("cancel", "999", env=alice).returncode == 1


def test_demo_on_port_0_names_the_port_it_bound(tmp_path, assets):
    """`tunedeck demo` with TUNEDECK_PORT=0: the system picks the port, and every URL printed names it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "demo").symlink_to(assets / "demo", target_is_directory=True)  # built: the demo reuses it
    env = {
        **os.environ,
        "TUNEDECK_WORKSPACE": str(ws),
        "TUNEDECK_ALLOWED_ROOTS": json.dumps([str(assets)]),
        "TUNEDECK_PORT": "0",
        "TUNEDECK_LAUNCH_PAUSED": "true",  # the demo job is submitted, not run
    }
    out = tmp_path / "demo.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck.cli.main", "demo"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        found = until(lambda: re.search(r"dashboard: (\S+)", out.read_text()), "the dashboard line", 240)
        url = found.group(1)
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port != 0, out.read_text()
        text = out.read_text()
        assert f"serving on {url} (bound to 127.0.0.1:{port})" in text, text
        jobs = httpx.get(f"{url}/api/jobs", timeout=30).json()["jobs"]
        assert [j["name"] for j in jobs] == ["demo"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)

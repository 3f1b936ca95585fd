"""README promises without a test of their own elsewhere: each test names the sentence it holds the code to."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import threading
from http.server import HTTPServer

import pytest
import yaml

from tests.sseclient import events
from tests.utils.factories import create_job, post_telemetry
from tests.utils.servers import demo_config
from tests.utils.standin import training_env
from tests.utils.wait import until
from tests.utils.webhooks import Receiver

GiB = 1 << 30


def test_a_train_yaml_posted_as_is_becomes_a_job(app_factory, assets):
    """`curl -X POST 'localhost:8420/api/jobs/yaml?name=seed' -H 'content-type: application/yaml' ...`"""
    app = app_factory()
    config = demo_config(assets, learning_rate=0.001, lora_rank=4)
    r = app.api.post(
        "/api/jobs/yaml",
        params={"name": "seed"},
        content=yaml.safe_dump(config),
        headers={"Content-Type": "application/yaml"},
    )
    assert r.status_code == 201, r.text
    job = app.api.get(f"/api/jobs/{r.json()['id']}").json()
    assert (job["name"], job["status"], job["gpus"]) == ("seed", "queued", 0)
    written = yaml.safe_load(app.api.get(f"/api/jobs/{job['id']}/config").json()["train_yaml"])
    assert {k: written[k] for k in config} == config  # every key as posted (the paths were absolute already)
    assert written["output_dir"] == job["output_dir"] and os.path.basename(job["run_dir"]).endswith("-seed")


def test_series_keep_spikes_when_downsampled_and_zoom_gets_finer_points(app_factory, assets):
    """`GET /api/jobs/{id}/series?max_points=&x0=&x1=` gives chart series read from chart tiles ... so spikes
    survive."""
    app = app_factory()
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="long", runner_token="r")
    n, spike, dip = 3000, 1234, 2345
    losses = [2.0 + 0.01 * ((k * 7919) % 13) for k in range(1, n + 1)]
    losses[spike - 1], losses[dip - 1] = 40.0, 0.001
    points = [{"current_steps": k, "total_steps": n, "loss": losses[k - 1]} for k in range(1, n + 1)]
    for seq, start in enumerate(range(0, n, 1000)):
        assert (
            post_telemetry(
                app.api, job.id, "r", seq=seq, start_line=start, points=points[start : start + 1000]
            ).status_code
            == 200
        )
    whole = app.api.get(f"/api/jobs/{job.id}/series", params={"max_points": 100}).json()
    loss = whole["series"]["loss"]
    assert whole["downsampled"] and loss["n"] == n and len(loss["step"]) <= 100
    got = dict(zip(loss["step"], loss["y"], strict=True))
    assert got[spike] == 40.0 and got[dip] == 0.001  # one-step extremes survive a 30x reduction
    assert loss["step"] == sorted(loss["step"]) and {1, n} <= set(loss["step"])

    zoom = app.api.get(
        f"/api/jobs/{job.id}/series", params={"max_points": 100, "x0": 1200, "x1": 1300}
    ).json()
    near = zoom["series"]["loss"]
    assert near["n"] == 101 and all(1200 <= s <= 1300 for s in near["step"])
    assert len(near["step"]) > len(
        [s for s in loss["step"] if 1200 <= s <= 1300]
    )  # finer than the whole view
    assert dict(zip(near["step"], near["y"], strict=True))[spike] == 40.0


def test_the_outbox_of_a_dead_runner_is_replayed_logs_and_memory_too(app_factory, assets):
    """ "...and the server replays the outbox of a runner that died": every kind of item in it."""
    app = app_factory()
    job = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name="died",
        runner_token="r",
        gpus=1,
        node_gpus=1,
    )
    t = 1_800_000_000.0
    batches = [
        {
            "seq": 0,
            "metrics": [{"line": 0, "t": t, "raw": json.dumps({"current_steps": 1, "loss": 2.5})}],
            "logs": [{"line": 0, "t": t, "stream": "stdout", "text": "step one"}],
            "states": [],
            "memory": [
                {"line": i, "t": t + i, "gpu": 0, "used_bytes": (1 + i) * GiB, "total_bytes": 64 * GiB}
                for i in range(3)
            ],
        },
        {
            "seq": 1,
            "metrics": [{"line": 1, "t": t + 1, "raw": json.dumps({"current_steps": 2, "loss": 2.0})}],
            "logs": [{"line": 1, "t": t + 1, "stream": "stderr", "text": "step two"}],
            "states": [],
            "memory": [{"line": 3, "t": t + 3, "gpu": 0, "used_bytes": 5 * GiB, "total_bytes": 64 * GiB}],
        },
    ]
    with open(os.path.join(job.run_dir, "outbox.jsonl"), "w") as f:
        f.writelines(json.dumps(b) + "\n" for b in batches)
        f.write('{"seq": 2, "metrics": [')  # torn by the kill: skipped
    os.kill(job.runner_pid, signal.SIGKILL)  # none of it was ever sent
    until(lambda: app.api.get(f"/api/jobs/{job.id}").json()["status"] != "running", "the runner found lost")
    assert [p["loss"] for p in app.all(job.id, "metrics")] == [2.5, 2.0]
    assert [(x["stream"], x["text"]) for x in app.all(job.id, "logs")] == [
        ("stdout", "step one"),
        ("stderr", "step two"),
    ]
    memory = app.api.get(f"/api/jobs/{job.id}/memory", params={"limit": 100}).json()["samples"]
    assert [m["used_bytes"] for m in memory] == [GiB, 2 * GiB, 3 * GiB, 5 * GiB]


class HangingHook:
    """A webhook endpoint that reads each request and answers nothing until released."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.requests: list[bytes] = []
        self.given_up = 0  # connections the client closed while we held them
        self.release = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < self._length(data):
                data += conn.recv(65536)
            self.requests.append(data)
            while not self.release.is_set():
                if select.select([conn], [], [], 0.05)[0] and not conn.recv(1, socket.MSG_PEEK):
                    self.given_up += 1
                    return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    @staticmethod
    def _length(data: bytes) -> int:
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        return (
            int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            if b"content-length:" in head
            else 0
        )


@pytest.fixture
def hook():
    """Listening until after the app has stopped (set up before app_factory), so its last webhooks get answers."""
    h = HangingHook()
    yield h
    h.release.set()
    h.sock.close()


@pytest.fixture
def good_hook():
    Receiver.got = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def test_a_hanging_webhook_blocks_neither_api_nor_telemetry(hook, good_hook, app_factory, assets):
    """ "Callers only enqueue; ... a webhook that is down never slows training telemetry" (hangs, not only refuses),
    nor the other webhooks: each URL has its own lane."""
    try:
        app = app_factory(
            TUNEDECK_WEBHOOK_URLS=json.dumps([hook.url, good_hook]), TUNEDECK_WEBHOOK_MIN_SEVERITY="info"
        )
        first = create_job(app.engine, app.settings, config=demo_config(assets), name="first")
        assert app.api.post(f"/api/jobs/{first.id}/cancel").status_code == 200  # its end goes to the hook
        until(lambda: hook.requests, "the webhook request")
        # The hook holds that request: everything else goes on meanwhile.
        job = create_job(
            app.engine,
            app.settings,
            config=demo_config(assets),
            name="watched",
            runner_token="r",
            gpus=1,
            node_gpus=1,
        )
        full = [
            {"line": i, "t": 1_800_000_000.0 + i, "gpu": 0, "used_bytes": 99 * GiB, "total_bytes": 100 * GiB}
            for i in range(10)
        ]
        r = post_telemetry(
            app.api, job.id, "r", seq=0, points=[{"current_steps": 1, "loss": 2.0}], memory=full
        )
        assert r.status_code == 200
        until(
            lambda: any(
                a["kind"] == "vram_near_oom" for a in app.api.get(f"/api/jobs/{job.id}/alerts").json()
            ),
            "the near-OOM alert",
        )
        assert app.api.post(f"/api/jobs/{job.id}/cancel").status_code == 200
        assert [p["loss"] for p in app.all(job.id, "metrics")] == [2.0]
        # The other webhook got both messages, the end and the alert, while the hanging one holds the first.
        until(
            lambda: (
                {("job_finished", first.id), ("alert", job.id)}
                <= {(m["event"], m["job_id"]) for m in Receiver.got}
            ),
            "both messages at the webhook that answers",
        )
        # All of that happened while the first request was still held (the webhook client had not given up).
        assert len(hook.requests) == 1 and hook.given_up == 0
        held = json.loads(hook.requests[0].split(b"\r\n\r\n", 1)[1])
        assert (held["event"], held["job_id"], held["status"]) == ("job_finished", first.id, "cancelled")
    finally:
        hook.release.set()  # answer what is held and all that comes


@pytest.mark.timeout(300)
def test_the_job_stream_sends_alert_events(app_factory, assets):
    """Live updates: `GET /api/stream?job=ID` (events `job`, `metrics`, `logs`, `memory`, `alerts`)."""
    app = app_factory()
    job = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name="hot",
        runner_token="r",
        gpus=1,
        node_gpus=1,
    )
    full = [
        {"line": i, "t": 1_800_000_000.0 + i, "gpu": 0, "used_bytes": 99 * GiB, "total_bytes": 100 * GiB}
        for i in range(10)
    ]
    assert post_telemetry(app.api, job.id, "r", seq=0, memory=full).status_code == 200
    stored = until(
        lambda: [a for a in app.api.get(f"/api/jobs/{job.id}/alerts").json() if a["kind"] == "vram_near_oom"],
        "the near-OOM alert",
    )
    with app.api.stream("GET", "/api/stream", params={"job": job.id}) as r:
        assert r.status_code == 200
        for ev in events(r):
            if ev["event"] == "alerts":
                sent = ev["data"]
                break
    assert [(a["id"], a["kind"], a["severity"], a["gpu"]) for a in sent] == [
        (a["id"], a["kind"], a["severity"], a["gpu"]) for a in stored
    ]
    assert ev["id"].split("-")[3].startswith("a") and int(ev["id"].split("-")[3][1:]) == stored[-1]["id"]


def test_runs_may_reach_the_hub_when_allowed(server_factory, assets, tmp_path):
    """ "Runs are offline (`HF_HUB_OFFLINE=1`) ... any hub id with `TUNEDECK_ALLOW_HUB`": the trainer is then online."""
    server = server_factory(
        TUNEDECK_ALLOW_HUB="true",
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")),
    )
    job = server.submit({"name": "online", "config": demo_config(assets), "gpus": 0})
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=180)
    assert done["status"] == "succeeded", done
    env = json.loads(
        (tmp_path / "ws" / "runs").glob("*-online").__next__().joinpath("trainer-env.json").read_text()
    )
    assert "HF_HUB_OFFLINE" not in env and env["RECORD_VRAM"] == "1"

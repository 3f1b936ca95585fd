"""A runner reports only the devices its job was given: `gpus` GPU indices on each of its `nodes`,
and each node's host memory (gpu -1). A batch naming more is refused with a 422 naming the field,
before anything of it is stored, however many indices it names; a dead runner's outbox, replayed by
the scheduler, is held to the same rule."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.utils.factories import create_job
from tests.utils.servers import demo_config
from tests.utils.wait import until
from tunedeck.contract import wire
from tunedeck.services.ingest.devices import Devices, NotGiven

RUNNER = "runner-secret"
AUTH = {"Authorization": f"Bearer {RUNNER}"}


def columns(gpus: list[int], first_line: int = 0) -> dict:
    n = len(gpus)
    return {
        "line": list(range(first_line, first_line + n)),
        "t": [1_800_000_000.0 + i for i in range(n)],
        "gpu": gpus,
        "used_bytes": [1 << 30] * n,
    }


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    app = App(tmp_path_factory.mktemp("devices") / "ws", assets).start()
    yield app
    app.stop()


def job(app, assets, name: str, *, gpus: int, nodes: int = 1) -> int:
    made = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name=name,
        gpus=gpus,
        node_gpus=gpus,
        runner_token=RUNNER,
        nodes=nodes,
    )
    return made.id


def post(app, job_id: int, batch: dict, *, packed: bool = False):
    if packed:
        return app.api.post(
            f"/api/jobs/{job_id}/telemetry",
            content=wire.encode(batch),
            headers={**AUTH, "Content-Type": wire.MEDIA_TYPE},
        )
    return app.api.post(f"/api/jobs/{job_id}/telemetry", json=batch, headers=AUTH)


def refusal(r) -> dict:
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    return err


def series(app, job_id: int) -> set[tuple[str, int]]:
    got = app.api.get(f"/api/jobs/{job_id}/memory", params={"limit": 100000}).json()
    return {(s["node"], s["gpu"]) for s in got["samples"]}


def test_a_multi_node_job_reports_its_gpus_on_each_node_and_nothing_more(app, assets):
    two = job(app, assets, "two-by-two", gpus=2, nodes=2)
    # Each node's GPUs and host memory, in the runner's packed form and as JSON.
    assert (
        post(
            app, two, {"seq": 0, "node": "node-a", "memory": columns([0, 1, -1, 0])}, packed=True
        ).status_code
        == 200
    )
    assert post(app, two, {"seq": 1, "node": "node-b", "memory": columns([3, 5], 10)}).status_code == 200
    assert post(app, two, {"seq": 2, "node": "node-a", "memory": columns([1, 0], 20)}).status_code == 200

    # A third GPU on a node: refused at the sample that names it, in either form.
    err = refusal(post(app, two, {"seq": 3, "node": "node-a", "memory": columns([0, 2], 30)}, packed=True))
    assert err["loc"] == ["body", "memory", "gpu", 1]
    assert (
        "given 2 GPU(s) on each node" in err["msg"] and "GPU 2 is not one of the job's devices" in err["msg"]
    )
    rows = [
        {"line": 40, "t": 1.0, "gpu": 5, "used_bytes": 1},
        {"line": 41, "t": 1.0, "gpu": 4, "used_bytes": 1},
    ]
    err = refusal(post(app, two, {"seq": 3, "node": "node-b", "memory": rows}))
    assert err["loc"] == ["body", "memory", 1, "gpu"] and "GPU 4" in err["msg"]
    # A third node.
    err = refusal(post(app, two, {"seq": 3, "node": "node-c", "memory": columns([0], 50)}))
    assert err["loc"] == ["body", "node"] and "'node-c' is not one of its nodes" in err["msg"]
    # A batch naming 20,000 GPU indices is refused at the third, and none of its samples is stored.
    batches = app.app.state.writer.batches
    err = refusal(
        post(app, two, {"seq": 3, "node": "node-b", "memory": columns(list(range(20000)), 100)}, packed=True)
    )
    assert err["loc"] == ["body", "memory", "gpu", 2]
    assert app.app.state.writer.batches == batches  # never reached the writer
    assert series(app, two) == {("node-a", 0), ("node-a", 1), ("node-a", -1), ("node-b", 3), ("node-b", 5)}
    # A batch without memory names no device: logs of any node are taken.
    logs = [{"line": 0, "t": 1.0, "stream": "stdout", "text": "hello"}]
    assert post(app, two, {"seq": 4, "node": "node-c", "logs": logs}).status_code == 200

    # A server that restarts reads the job's series from its samples (no memory of them here).
    fresh = Devices(app.engine)
    fresh.admit(job_id=two, gpus=2, nodes=2, node="node-b", memory={"gpu": [5, 3, -1]})
    with pytest.raises(NotGiven) as refused:
        fresh.admit(job_id=two, gpus=2, nodes=2, node="node-a", memory={"gpu": [7]})
    assert refused.value.loc == ("body", "memory", "gpu", 0)
    with pytest.raises(NotGiven) as refused:
        fresh.admit(job_id=two, gpus=2, nodes=2, node="", memory=[{"gpu": 0}])
    assert refused.value.loc == ("body", "node")


def test_a_cpu_job_reports_host_memory_only(app, assets):
    cpu = job(app, assets, "on-the-cpu", gpus=0)
    assert post(app, cpu, {"seq": 0, "memory": columns([-1, -1])}).status_code == 200
    err = refusal(post(app, cpu, {"seq": 1, "memory": columns([-1, 0], 5)}))
    assert err["loc"] == ["body", "memory", "gpu", 1]
    assert "runs on the CPU: its runner reports host memory only (gpu -1)" in err["msg"]
    one = job(app, assets, "one-gpu", gpus=1)
    assert post(app, one, {"seq": 0, "memory": columns([0, -1, 0])}).status_code == 200
    assert refusal(post(app, one, {"seq": 1, "memory": columns([1], 5)}))["loc"] == [
        "body",
        "memory",
        "gpu",
        0,
    ]
    assert series(app, one) == {("", 0), ("", -1)}


def test_a_replayed_outbox_is_held_to_the_same_rules(app, assets):
    """The trainer (code the job chose) can write the run folder: the outbox is read as the route reads."""
    made = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name="died",
        gpus=1,
        node_gpus=1,
        runner_token=RUNNER,
    )

    def logs(line: int, text: str) -> list[dict]:
        return [{"line": line, "t": 1_800_000_000.0 + line, "stream": "stdout", "text": text}]

    lines = [
        {"seq": 0, "node": "n", "logs": logs(0, "zero"), "memory": columns([0, -1])},
        {"seq": "not a number", "logs": logs(1, "never")},  # the model refuses it: skipped
        {"seq": 1, "node": "n", "logs": logs(2, "two"), "memory": columns(list(range(20000)), 10)},
        {"seq": 2, "node": "n", "states": [{"event": "exited", "exit_code": 0}]},
    ]
    Path(made.run_dir, "outbox.jsonl").write_text("".join(json.dumps(b) + "\n" for b in lines))
    os.kill(made.runner_pid, signal.SIGKILL)  # the runner dies with all of it unsent
    done = until(
        lambda: (j := app.api.get(f"/api/jobs/{made.id}").json())["status"] != "running" and j,
        "the runner found lost and its outbox replayed",
    )
    assert done["status"] == "succeeded", done  # the trainer's end, from the outbox
    assert [x["text"] for x in app.all(made.id, "logs")] == ["zero", "two"]
    assert series(app, made.id) == {("n", 0), ("n", -1)}  # the 20,000 GPUs left out, not their batch

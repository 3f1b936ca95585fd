"""Stack dumps through the API: a stall alert (or the job's owner) asks, the answer to the runner's
next batch carries the request's number, the runner's report is kept with the job and read back with
where each rank waits; reports nobody asked for, strangers and ended jobs are refused."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.utils.app import App
from tests.utils.factories import create_job, post_telemetry
from tests.utils.servers import demo_config
from tests.utils.wait import until

TORCH = "/venv/lib/python3.11/site-packages/torch"


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    a = App(tmp_path_factory.mktemp("stacks") / "ws", assets).start()
    yield a
    a.stop()


def frames(*names: tuple[str, str]) -> list[dict]:
    return [{"name": n, "file": f, "line": 10 + i} for i, (n, f) in enumerate(names)]


IN_ALL_REDUCE = frames(
    ("all_reduce", f"{TORCH}/distributed/distributed_c10d.py"),
    ("wrapper", f"{TORCH}/distributed/c10d_logger.py"),
    ("allreduce_hook", f"{TORCH}/distributed/algorithms/ddp_comm_hooks/default_hooks.py"),
    ("backward", f"{TORCH}/autograd/__init__.py"),
    ("training_step", "/venv/lib/python3.11/site-packages/transformers/trainer.py"),
)
LOADING = frames(
    ("__getitem__", "/venv/lib/python3.11/site-packages/datasets/arrow_dataset.py"),
    ("fetch", f"{TORCH}/utils/data/_utils/fetch.py"),
    ("__next__", f"{TORCH}/utils/data/dataloader.py"),
    ("_inner_training_loop", "/venv/lib/python3.11/site-packages/transformers/trainer.py"),
)


def process(pid: int, rank: int | None, stack: list[dict]) -> dict:
    return {
        "pid": pid,
        "rank": rank,
        "command": "python train.py",
        "threads": [{"name": None, "frames": stack}],
    }


def report(request: int, node: str, runner_rank: int, *procs: dict) -> dict:
    return {"request": request, "node": node, "runner_rank": runner_rank, "processes": list(procs)}


def test_a_stall_asks_each_runner_for_stacks_and_the_dumps_say_where_each_rank_waits(app, assets):
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="hung", runner_token="r")
    # Steps a second apart that ended hours ago (past any save or evaluation allowance): a stall.
    points = [{"current_steps": i, "total_steps": 100, "loss": 2.0} for i in range(1, 21)]
    r = post_telemetry(app.api, job.id, "r", seq=0, points=points, t=time.time() - 20000)
    assert r.status_code == 200 and "stacks" not in r.json(), r.text  # no dump asked yet
    until(
        lambda: any(
            a["kind"] == "stall" and a["open"] for a in app.api.get(f"/api/jobs/{job.id}/alerts").json()
        ),
        "the stall alert",
    )
    seq = itertools.count(1)
    asked = until(
        lambda: (
            post_telemetry(app.api, job.id, "r", seq=(n := next(seq)), start_line=100 + n, logs=["."])
            .json()
            .get("stacks")
        ),
        "a stack-dump request in the answer to a batch",
    )
    assert asked == 1
    runner = {"Authorization": "Bearer r"}
    first = report(
        1, "node-a", 0, process(11, None, []), process(12, 0, IN_ALL_REDUCE), process(13, 1, IN_ALL_REDUCE)
    )
    second = report(
        1, "node-b", 1, process(21, 2, LOADING), {"pid": 22, "rank": 3, "error": "py-spy: Permission denied"}
    )
    for body in (first, second, second):  # a resend replaces its node's report
        r = app.api.post(f"/api/jobs/{job.id}/telemetry/stacks", json=body, headers=runner)
        assert r.status_code == 200 and r.json() == {"request": 1}, r.text
    got = app.api.get(f"/api/jobs/{job.id}/stacks").json()
    assert got["request"] == 1 and got["reason"] == "a stall alert opened"
    assert got["summary"] == (
        "ranks 0–1 in all_reduce (backward), rank 2 in data loading, rank 3 in not dumped: py-spy: Permission denied"
    )
    assert [(r["rank"], r["node"], r["pid"]) for r in got["ranks"]] == [
        (0, "node-a", 12),
        (1, "node-a", 13),
        (2, "node-b", 21),
        (3, "node-b", 22),
    ]
    assert [n["node"] for n in got["nodes"]] == ["node-a", "node-b"]
    assert got["flight_recorder"] is None  # the job did not turn the recorder on
    assert got["nodes"][0]["processes"][1]["threads"][0]["frames"][0]["name"] == "all_reduce"

    # The owner asks again: a new number, its own dumps; the first stays readable by number.
    again = app.api.post(f"/api/jobs/{job.id}/stacks")
    assert again.status_code == 202 and again.json() == {"request": 2}
    assert app.api.get(f"/api/jobs/{job.id}/stacks").json()["summary"] is None  # nothing came yet
    assert (
        app.api.get(f"/api/jobs/{job.id}/stacks", params={"request": 1})
        .json()["summary"]
        .startswith("ranks 0–1")
    )
    answer = post_telemetry(app.api, job.id, "r", seq=next(seq), start_line=900, logs=["."]).json()
    assert answer["stacks"] == 2

    # With the flight recorder on, each rank's record comes beside its frames, across nodes.
    def recorded(pid: int, rank: int, enqueued: int, completed: int) -> dict:
        pending = [{"pg": "0", "seq": completed + 1, "op": "all_reduce", "sizes": [[4096]]}]
        flight = {
            "source": "asked",
            "groups": [{"pg": "0", "last_enqueued": enqueued, "last_completed": completed}],
            "pending": pending if enqueued > completed else [],
        }
        return {**process(pid, rank, IN_ALL_REDUCE), "flight": flight}

    for body in (
        report(2, "node-a", 0, recorded(12, 0, 41, 40), recorded(13, 1, 41, 40)),
        report(
            2,
            "node-b",
            1,
            recorded(21, 2, 40, 40),
            {
                "pid": 22,
                "rank": 3,
                "flight": {"source": "asked", "error": "it did not answer: a stopped or lost rank"},
            },
        ),
    ):
        r = app.api.post(f"/api/jobs/{job.id}/telemetry/stacks", json=body, headers=runner)
        assert r.status_code == 200, r.text
    assert app.api.get(f"/api/jobs/{job.id}/stacks").json()["flight_recorder"] == (
        "ranks 0–1 in all_reduce #41, not completed; rank 2 never entered #41 (completed #40); "
        "rank 3 no flight record (it did not answer: a stopped or lost rank)"
    )


def test_stack_dumps_nobody_asked_for_strangers_and_ended_jobs_are_refused(app, assets):
    job = create_job(app.engine, app.settings, config=demo_config(assets), name="quiet", runner_token="q")
    r = app.api.get(f"/api/jobs/{job.id}/stacks")
    assert r.status_code == 404
    assert r.json()["detail"].startswith(f"job {job.id} has no stack dump: none was asked"), r.text
    body = report(1, "node-a", 0, process(5, 0, LOADING))
    r = app.api.post(f"/api/jobs/{job.id}/telemetry/stacks", json=body)
    assert r.status_code == 401, r.text  # the runner's token only
    r = app.api.post(f"/api/jobs/{job.id}/telemetry/stacks", json=body, headers={"Authorization": "Bearer q"})
    assert r.status_code == 409 and "was not asked for stack dump 1" in r.text
    assert app.api.post(f"/api/jobs/{job.id}/stacks").status_code == 202
    bad = {**body, "node": "../../etc"}  # a node name is a host name: it names a file of the job's
    r = app.api.post(f"/api/jobs/{job.id}/telemetry/stacks", json=bad, headers={"Authorization": "Bearer q"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "node"], r.text
    r = app.api.get(f"/api/jobs/{job.id}/stacks", params={"reqest": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "reqest"], r.text
    r = app.api.get(f"/api/jobs/{job.id}/stacks", params={"request": 7})
    assert r.status_code == 404 and r.json()["detail"] == f"job {job.id} has no stack dump 7"
    assert app.api.post(f"/api/jobs/{job.id}/cancel").status_code == 200
    until(lambda: app.api.get(f"/api/jobs/{job.id}").json()["status"] == "cancelled", "the job cancelled")
    r = app.api.post(f"/api/jobs/{job.id}/stacks")
    assert r.status_code == 409 and "only a running job's processes can be dumped" in r.text

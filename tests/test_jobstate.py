"""Job status has one owner: every pair of states is tried against the transition table on a real
SQLite file, with a real webhook receiver and the real alert engine listening; and no other module
of the server writes `status`."""

from __future__ import annotations

import ast
import json
import os
import signal
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import Session, select

from tests.utils.factories import create_job, post_telemetry
from tests.utils.servers import demo_config
from tests.utils.wait import until
from tests.utils.webhooks import Receiver
from tunedeck.config import Settings
from tunedeck.services.alerting.engine import AlertEngine
from tunedeck.services.alerting.notify import Notifier
from tunedeck.services.jobs.jobstate import ALLOWED, JobState, explain, move
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Alert, Job, JobStatus

PACKAGE = Path(__file__).resolve().parents[1] / "backend" / "tunedeck"
OWNER = PACKAGE / "services" / "jobs" / "jobstate.py"
GiB = 1 << 30


def new_job(engine, status: JobStatus) -> int:
    """A job already in `status` (written directly: the test sets the stage the server would have),
    holding a runner token and one open alert."""
    with Session(engine) as s:
        job = Job(
            name=f"in-{status.value}", spec="{}", train_yaml="", runner_token_hash="h" * 64, devices="0"
        )
        s.add(job)
        s.flush()
        s.add(
            Alert(
                job_id=job.id,
                kind="vram_spike",
                gpu=0,
                severity="warning",
                t=1.0,
                first_t=1.0,
                last_t=1.0,
                message="spike",
                open=True,
            )
        )
        s.commit()
        job_id = job.id
    with engine.begin() as c:
        c.execute(text("UPDATE jobs SET status = :s WHERE id = :id"), {"s": status.name, "id": job_id})
    return job_id


def row(engine, job_id: int) -> dict:
    with engine.connect() as c:
        return dict(c.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id}).mappings().one())


def change_seq(engine, job_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT seq FROM job_changes WHERE job_id = :id"), {"id": job_id}).scalar_one()


def alert_open(engine, job_id: int) -> bool:
    with Session(engine) as s:
        return any(s.exec(select(Alert.open).where(Alert.job_id == job_id)))


@pytest.fixture
def world(tmp_path):
    http = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    Receiver.got = []
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    settings = Settings(workspace=tmp_path, webhook_urls=[f"http://127.0.0.1:{http.server_port}/hook"])
    notifier = Notifier(settings, engine)
    # No sweep of running jobs during a test: an alert closes only when the engine is told of an end.
    alerts = AlertEngine(engine, settings, on_new=notifier.alerts_opened, sweep_s=3600)
    notifier.start()
    alerts.start()
    yield engine, JobState(engine, notifier=notifier, alerts=alerts), notifier
    alerts.stop()
    notifier.stop()
    http.shutdown()


def test_every_pair_of_states_against_the_table(world):
    engine, state, notifier = world
    assert all(frm != to and not frm.finished for frm, to in ALLOWED)  # an end is final
    ended: dict[int, tuple[JobStatus, JobStatus]] = {}
    for frm in JobStatus:
        for to in JobStatus:
            job_id = new_job(engine, frm)
            before, seq = row(engine, job_id), change_seq(engine, job_id)
            with state.begin() as conn:
                moved = move(conn, job_id, to, exit_code=3, error="why")
            after = row(engine, job_id)
            if (frm, to) not in ALLOWED:
                assert not moved, (frm, to)
                assert after == before and change_seq(engine, job_id) == seq, (frm, to)
                continue
            assert moved and after["status"] == to.name and change_seq(engine, job_id) > seq, (frm, to)
            with state.begin() as conn:  # once: the same move again finds the job moved on
                assert not move(conn, job_id, to)
            assert row(engine, job_id) == after
            if to == JobStatus.running:
                assert after["started_at"] and after["runner_token_hash"] and after["finished_at"] is None
            else:
                assert after["finished_at"] and after["runner_token_hash"] is None, (
                    frm,
                    to,
                )  # its runner's token dies
                assert (after["exit_code"], after["error"]) == (3, "why")
                ended[job_id] = (frm, to)
    assert {to for _, to in ended.values()} == {JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled}
    # Each end is told once: a webhook naming the job and its state, and the alert engine's final judgement.
    until(lambda: {g["job_id"] for g in Receiver.got} >= set(ended), "a webhook for every end")
    for job_id in ended:
        until(lambda j=job_id: not alert_open(engine, j), f"job {job_id}'s alerts to close")
    notifier.stop()  # sends whatever was queued, so a webhook for a refused move would be here now
    done = [g for g in Receiver.got if g["event"] == "job_finished"]
    assert sorted((g["job_id"], g["status"]) for g in done) == sorted(
        (j, to.value) for j, (_, to) in ended.items()
    )
    for g in done:
        frm, to = ended[g["job_id"]]
        assert g["text"] == f"tunedeck: job {g['job_id']} (in-{frm.value}) {to.value}: why"


def test_a_cause_said_better_keeps_a_resume_already_made_and_anything_written_since(world):
    """explain: the error only while it is still the one the caller read; auto_resume only where none
    is set (the resumer may have made the next attempt between the read and this write)."""
    engine, state, _ = world
    fresh, resumed = new_job(engine, JobStatus.failed), new_job(engine, JobStatus.failed)
    with engine.begin() as c:
        c.execute(text("UPDATE jobs SET error = 'stopped', auto_resume = NULL WHERE id = :id"), {"id": fresh})
        c.execute(
            text("UPDATE jobs SET error = 'stopped', auto_resume = 'resumed as job 9' WHERE id = :id"),
            {"id": resumed},
        )
    with state.begin() as c:
        assert explain(c, fresh, was="stopped", error="preempted", auto_resume="pending")
        assert explain(c, resumed, was="stopped", error="preempted", auto_resume="pending")
        assert not explain(c, fresh, was="stopped", error="again", auto_resume="other")
    assert (row(engine, fresh)["error"], row(engine, fresh)["auto_resume"]) == ("preempted", "pending")
    assert (row(engine, resumed)["error"], row(engine, resumed)["auto_resume"]) == (
        "preempted",
        "resumed as job 9",
    )
    assert row(engine, fresh)["status"] == JobStatus.failed.name


def test_an_end_rolled_back_is_told_to_nobody(world):
    engine, state, notifier = world
    rolled, kept = new_job(engine, JobStatus.running), new_job(engine, JobStatus.running)
    before = row(engine, rolled)
    with pytest.raises(OSError), state.begin() as conn:  # e.g. the disk filled before the commit
        assert move(conn, rolled, JobStatus.failed, error="lost")
        raise OSError("no space left on device")
    assert row(engine, rolled) == before
    with state.begin() as conn:
        assert move(conn, kept, JobStatus.succeeded)
    until(lambda: any(g["job_id"] == kept for g in Receiver.got), "the committed end's webhook")
    notifier.stop()
    assert [g["job_id"] for g in Receiver.got] == [kept]
    assert alert_open(engine, rolled)


def test_a_move_outside_a_job_state_transaction_is_refused(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine, JobStatus.running)
    with engine.begin() as conn, pytest.raises(RuntimeError, match="JobState.begin"):
        move(conn, job_id, JobStatus.failed)  # its end would be told to nobody
    assert row(engine, job_id)["status"] == "running"


def test_a_lost_runner_ends_its_job_with_the_webhook_and_its_alerts_closed(app_factory, assets):
    http = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    Receiver.got = []
    try:
        app = app_factory(TUNEDECK_WEBHOOK_URLS=json.dumps([f"http://127.0.0.1:{http.server_port}/hook"]))
        job = create_job(
            app.engine,
            app.settings,
            config=demo_config(assets),
            name="lost",
            runner_token="r",
            gpus=1,
            node_gpus=1,
        )
        full = [
            {"line": i, "t": 1_800_000_000.0 + i, "gpu": 0, "used_bytes": 97 * GiB, "total_bytes": 100 * GiB}
            for i in range(10)
        ]
        assert post_telemetry(app.api, job.id, "r", seq=0, memory=full).status_code == 200
        until(lambda: alert_open(app.engine, job.id), "the near-OOM alert")
        os.kill(job.runner_pid, signal.SIGKILL)  # the runner dies without a word
        got = until(
            lambda: (j := app.api.get(f"/api/jobs/{job.id}").json())["status"] != "running" and j,
            "the scheduler to find the runner lost",
        )
        assert got["status"] == "failed" and got["error"].startswith("runner lost")
        until(lambda: not alert_open(app.engine, job.id), "the final judgement to close the alert")
        done = until(lambda: [g for g in Receiver.got if g["event"] == "job_finished"], "the end's webhook")
        assert [(g["job_id"], g["status"]) for g in done] == [(job.id, "failed")]
    finally:
        http.shutdown()


# ---------------------------------------------------------------- nothing else writes `status`
def status_writes(tree: ast.AST) -> list[int]:
    """Lines that set a job's status: `x.status = ...` (not an object's own `self.status` outside the
    Job table), `.values(status=...)`, `.values({"status": ...})` or `.values(**columns)` (which could
    hold it), `Job(status=...)` or `Job(**columns)`, `setattr(x, "status", ...)`, and SQL text that
    updates `status` of `jobs`."""
    hits = []
    classes: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ClassDef):
            classes.append(node.name)
        for target in _targets(node):
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr == "status":
                    own = isinstance(t.value, ast.Name) and t.value.id == "self" and "Job" not in classes
                    if not own:
                        hits.append(t.lineno)
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("values", "Job", "sqlmodel_update") and any(
                k.arg in ("status", None) for k in node.keywords
            ):
                hits.append(node.lineno)
            if name in ("values", "sqlmodel_update") and any(
                isinstance(a, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "status" for k in a.keys)
                for a in node.args
            ):
                hits.append(node.lineno)
            if name == "setattr" and len(node.args) > 1 and getattr(node.args[1], "value", None) == "status":
                hits.append(node.lineno)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql = " ".join(node.value.lower().split())
            if (
                "update jobs set" in sql
                and "status" in sql.split("update jobs set", 1)[1].split(" where ")[0]
            ):
                hits.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.ClassDef):
            classes.pop()

    visit(tree)
    return hits


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def test_the_checker_finds_each_way_of_writing_status():
    samples = [
        "job.status = JobStatus.failed",
        "job.status, job.finished_at = JobStatus.cancelled, utcnow()",
        "conn.execute(update(JOBS).where(JOBS.c.id == 1).values(status='failed'))",
        "conn.execute(update(JOBS).values({'status': 'failed'}))",
        "conn.execute(update(JOBS).values(**columns))",
        "s.add(Job(**columns))",
        "job.sqlmodel_update({'status': 'failed'})",
        "s.add(Job(name='x', status=JobStatus.succeeded))",
        "setattr(job, 'status', JobStatus.failed)",
        "c.execute(text('UPDATE jobs SET finished_at = 1, status = :s WHERE id = :id'))",
        "class Job:\n    def end(self):\n        self.status = 'failed'",
    ]
    for src in samples:
        assert status_writes(ast.parse(src)), src
    allowed = [
        "class AuthError(Exception):\n    def __init__(self, status):\n        self.status = status",
        "JobOut(status=job.status)",
        "q = q.where(Job.status == status)",
        "c.execute(text('UPDATE jobs SET last_batch_seq = 1 WHERE status = :s'))",
    ]
    for src in allowed:
        assert not status_writes(ast.parse(src)), src


def test_only_the_transition_module_writes_job_status():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER or "migrations" in path.parts:  # the schema's history is not a status change
            continue
        if lines := status_writes(ast.parse(path.read_text(), str(path))):
            found[str(path.relative_to(PACKAGE))] = lines
    assert found == {}, f"status written outside services/jobs/jobstate.py: {found}"
    assert status_writes(ast.parse(OWNER.read_text()))  # the owner's own write is seen, so the scan works

"""Who may do what: docs/team.md's table checked cell by cell against two real apps (the default
loopback set-up and a team server), a chat belonging to its owners, and only completions as use."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import Session

from tests.utils.app import App, TestClient
from tests.utils.factories import create_job, create_token
from tests.utils.servers import ROOT, demo_config, free_port
from tunedeck.services.jobs.jobstate import JobState, move
from tunedeck.store.tables import Job, JobStatus, utcnow

# A team server as the README starts one: a non-loopback address, writes closed, reads left unset.
TEAM = {"TUNEDECK_HOST": "0.0.0.0", "TUNEDECK_OPEN_WRITE": "false"}
HEADER = "| what | stranger on loopback (default) | stranger on a team server | viewer | submitter | admin |"
REFUSED = (401, 403)


def readme_table() -> dict[str, list[str]]:
    """docs/team.md's security table: each row's label and its cells, column by column."""
    lines = (ROOT / "docs" / "team.md").read_text().splitlines()
    start = lines.index(HEADER)
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        label, *cells = (c.strip() for c in line.strip().strip("|").split("|"))
        rows[label] = cells
    return rows


@pytest.fixture(scope="module")
def apps(tmp_path_factory, assets):
    root = tmp_path_factory.mktemp("who")
    loopback, team = App(root / "loopback", assets).start(), App(root / "team", assets, **TEAM).start()
    yield loopback, team
    team.stop()
    loopback.stop()


@dataclass
class Asker:
    """One column of the table: an app, the headers it is asked with, and whose jobs are its own.
    `kept` holds the app's jobs that probes only read or chat with, shared by its columns (a refused
    request changes nothing, and a chat request changes only the idle clock)."""

    app: App
    assets: Path
    headers: dict
    name: str | None
    kept: dict = field(default_factory=dict)

    def keep(self, key: tuple, make: Callable[[], Job]) -> Job:
        if key not in self.kept:
            self.kept[key] = make()
        return self.kept[key]

    def ask(self, method: str, path: str, **kw) -> int:
        r = self.app.api.request(method, path, headers=self.headers, **kw)
        assert r.status_code != 500, r.text
        return r.status_code

    def train(self, owner: str | None, *, finished: bool = False) -> Job:
        """A train job of `owner` holding an adapter in its output (ended when `finished`)."""
        app = self.app
        job = create_job(
            app.engine,
            app.settings,
            config=demo_config(self.assets),
            owner=owner,
            name="t",
            runner_token="r" if finished else None,  # ended as a launched job ends; else queued
        )
        out = Path(job.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "adapter_config.json").write_text('{"r": 8}')
        (out / "adapter_model.safetensors").write_bytes(b"w" * 64)
        if finished:
            with JobState(app.engine).begin() as conn:
                move(conn, job.id, JobStatus.succeeded, exit_code=0)
        return job

    def chat(self, owner: str | None, *, started_by: str | None = None, **columns) -> Job:
        """A running chat job serving a finished job of `owner`, started by `started_by` (default the
        owner); its model server's port answers nothing, so a request let through gets 503."""
        served = self.train(owner, finished=True)
        config = {
            "model_name_or_path": str(self.assets / "demo" / "model"),
            "adapter_name_or_path": served.output_dir,
            "template": "qwen",
            "finetuning_type": "lora",
        }
        return create_job(
            self.app.engine,
            self.app.settings,
            config=config,
            kind="chat",
            owner=started_by or owner,
            name="c",
            runner_token="r",
            api_port=free_port(),
            api_key="k",
            parent_id=served.id,
            **columns,
        )


def bobs(a: Asker) -> Job:
    """A queued job of bob's, for the probes that change nothing of it."""
    return a.keep(("bob",), lambda: a.train("bob"))


def reads(a: Asker) -> list[int]:
    job = bobs(a)
    data = {"dataset_dir": str(a.assets / "demo" / "data"), "name": "demo_identity"}
    base = f"/api/jobs/{job.id}"
    paths = ("", "/config", "/logs", "/metrics", "/series", "/memory", "/alerts", "/estimate")
    return [a.ask("GET", "/api/jobs"), a.ask("GET", "/api/ui/dataset-preview", params=data)] + [
        a.ask("GET", base + p) for p in paths
    ]


def downloads(a: Asker) -> list[int]:
    base = f"/api/jobs/{bobs(a).id}"
    return [
        a.ask("GET", f"{base}/files"),
        a.ask("GET", f"{base}/files/adapter_config.json"),
        a.ask("GET", f"{base}/archive"),
        a.ask("GET", f"{base}/archive", params={"what": "output"}),
    ]


def checks(a: Asker) -> list[int]:
    spec = {"name": "x", "config": demo_config(a.assets), "gpus": 0}
    return [a.ask("POST", "/api/lint", json=spec), a.ask("POST", "/api/estimate", json=spec)]


def submits(a: Asker) -> list[int]:
    parent = bobs(a)
    spec = {"name": "x", "config": demo_config(a.assets), "gpus": 0}
    return [
        a.ask("POST", "/api/jobs", json=spec),
        a.ask("POST", f"/api/jobs/{parent.id}/clone", json={}),
        a.ask("POST", f"/api/jobs/{parent.id}/resume", json={}),  # 409 past the gate: no checkpoint
    ]


def changes(owner: Callable[[Asker], str | None]) -> Callable[[Asker], list[int]]:
    def probe(a: Asker) -> list[int]:
        base = f"/api/jobs/{a.train(owner(a)).id}"
        return [
            a.ask("PATCH", base, json={"tags": ["x"]}),
            a.ask("POST", f"{base}/cancel"),
            a.ask("DELETE", base, params={"files": "remove"}),  # a kept folder would meet a reused id
        ]

    return probe


def chats(owner: Callable[[Asker], str | None]) -> Callable[[Asker], list[int]]:
    def probe(a: Asker) -> list[int]:
        chat = a.keep(("chat", owner(a)), lambda: a.chat(owner(a)))
        v1 = f"/api/jobs/{chat.id}/v1"
        return [
            a.ask("POST", f"/api/jobs/{chat.parent_id}/chat", json={"gpus": 0}),
            a.ask("GET", f"{v1}/models"),
            a.ask("POST", f"{v1}/chat/completions", json={"messages": []}),
        ]

    return probe


def own(a: Asker) -> str | None:
    return a.name


def others(a: Asker) -> str | None:
    return "bob"


PROBES = {
    "read jobs, metrics, logs, configs, dataset rows": reads,
    "download files and archives (adapters, checkpoints)": downloads,
    "lint and estimate a spec": checks,
    "`GET /metrics`": lambda a: [a.ask("GET", "/metrics")],
    "`GET /api/health`": lambda a: [a.ask("GET", "/api/health")],
    "submit, clone, resume": submits,
    "cancel, tag, delete own jobs": changes(own),
    "cancel, tag, delete others' jobs": changes(others),
    "start a chat on own job, chat with own chat job": chats(own),
    "start a chat on others' job, chat with others' chat job": chats(others),
}


def test_the_readme_table_of_who_may_do_what(apps, assets):
    loopback, team = apps
    tokens = {
        name: create_token(team.engine, name, role)
        for name, role in (("wall", "viewer"), ("alice", "submitter"), ("root", "admin"))
    }
    create_token(team.engine, "bob", "submitter")  # the owner of "others'" jobs

    def bearer(name: str) -> dict:
        return {"Authorization": f"Bearer {tokens[name]}"}

    kept: dict = {}
    columns = [
        Asker(loopback, assets, {}, None),
        Asker(team, assets, {}, None, kept),
        Asker(team, assets, bearer("wall"), "wall", kept),
        Asker(team, assets, bearer("alice"), "alice", kept),
        Asker(team, assets, bearer("root"), "root", kept),
    ]
    table = readme_table()
    assert table.keys() == PROBES.keys()  # every row of the table is checked, and only those
    wrong = []
    for label, cells in table.items():
        assert len(cells) == len(columns), label
        for column, (cell, asker) in enumerate(zip(cells, columns, strict=True)):
            assert cell in ("yes", "no"), (label, cell)
            got = PROBES[label](asker)
            if any((s in REFUSED) != (cell == "no") for s in got):
                wrong.append((label, HEADER.split("|")[column + 2].strip(), cell, got))
    assert wrong == []


def test_who_am_i_says_what_the_table_says_each_caller_may_do(apps, assets):
    """`GET /api/me` is what the pages offer actions by: each column's answer agrees with its cells."""
    loopback, team = apps
    tokens = {
        n: create_token(team.engine, f"me-{n}", r)
        for n, r in (("v", "viewer"), ("s", "submitter"), ("a", "admin"))
    }
    columns = [(loopback, {}, None, None), (team, {}, None, None)] + [
        (team, {"Authorization": f"Bearer {t}"}, f"me-{n}", r)
        for (n, t), r in zip(tokens.items(), ("viewer", "submitter", "admin"), strict=True)
    ]
    table = readme_table()
    for column, (app, headers, name, role) in enumerate(columns):
        r = app.api.get("/api/me", headers=headers)
        assert r.status_code == 200, r.text  # a stranger on a team server too: the page must learn to sign in
        me = r.json()
        assert (me["name"], me["role"]) == (name, role)
        assert (me["open_read"], me["open_write"]) == ((True, True) if app is loopback else (False, False))
        assert me["may_submit"] == (table["submit, clone, resume"][column] == "yes"), (column, me)
        own = me["acts_on"]["own" if name else "unowned"]
        assert own == (table["cancel, tag, delete own jobs"][column] == "yes"), (column, me)
        assert me["acts_on"]["others"] == (table["cancel, tag, delete others' jobs"][column] == "yes"), (
            column,
            me,
        )
    assert team.api.get("/api/me", headers={"Authorization": "Bearer tdk_forged"}).status_code == 401


def test_a_stranger_on_a_team_server_gets_nothing_but_health(apps, assets):
    """The reported hole: `/archive?what=output` answered 200 with no token on the README's team set-up."""
    _, team = apps
    stranger = Asker(team, assets, {}, None)
    job = stranger.train("alice")
    for path in (f"/api/jobs/{job.id}/archive", f"/api/jobs/{job.id}/config", f"/api/jobs/{job.id}/logs"):
        r = team.api.get(path, params={"what": "output"} if path.endswith("archive") else None)
        assert r.status_code == 401 and "off loopback" in r.json()["detail"], (path, r.text)
    assert team.api.get("/api/health").status_code == 200


def test_only_completions_reset_a_chat_jobs_idle_clock_and_a_load_is_not_idleness(apps, assets):
    """`GET .../v1/models`, the owner's or anyone's, is not use: it cannot keep a GPU held forever."""
    loopback, _ = apps
    day_ago = utcnow() - timedelta(days=1)
    chat = Asker(loopback, assets, {}, None).chat(None, created_at=day_ago, started_at=day_ago)  # loading
    (idle,) = [w for w in loopback.app.state.workers if w.name == "chat-idle"]

    def row() -> Job:
        with Session(loopback.engine) as s:
            return s.get(Job, chat.id)

    idle.run_once()
    assert row().cancel_requested_at is None and row().last_used_at is None  # its model still loads
    v1 = f"/api/jobs/{chat.id}/v1"
    assert loopback.api.get(f"{v1}/models").status_code == 503  # let through; nothing answers yet
    assert row().last_used_at is None
    assert loopback.api.post(f"{v1}/chat/completions", json={"messages": []}).status_code == 503
    first = row().last_used_at
    assert first is not None
    assert loopback.api.get(f"{v1}/models").status_code == 503
    assert row().last_used_at == first
    with Session(loopback.engine) as s:  # that completion a day ago: idle since
        s.exec(update(Job).where(Job.id == chat.id).values(last_used_at=day_ago))
        s.commit()
    idle.run_once()
    assert row().cancel_requested_at is not None


def test_a_chat_is_its_starters_and_the_served_jobs_owners(apps, assets):
    _, team = apps
    names = ("carol", "dave", "erin")
    tokens = {n: create_token(team.engine, n, "submitter") for n in names}
    a = Asker(team, assets, {}, None)
    chat = a.chat("carol", started_by="dave")  # dave started a chat on carol's job (as an admin might)
    for name, allowed in (("carol", True), ("dave", True), ("erin", False)):
        r = team.api.get(
            f"/api/jobs/{chat.id}/v1/models", headers={"Authorization": f"Bearer {tokens[name]}"}
        )
        assert (r.status_code == 503) == allowed and (r.status_code == 403) != allowed, (name, r.text)
    r = team.api.get(f"/api/jobs/{chat.id}/v1/models", headers={"Authorization": f"Bearer {tokens['erin']}"})
    assert "carol, dave" in r.json()["detail"]
    # Through the route, a chat job records the job it serves.
    served = a.train("carol", finished=True)
    r = team.api.post(
        f"/api/jobs/{served.id}/chat",
        json={"gpus": 0},
        headers={"Authorization": f"Bearer {tokens['carol']}"},
    )
    assert r.status_code == 201 and r.json()["parent_id"] == served.id, r.text


def test_open_reads_off_loopback_are_said_loudly_at_start(tmp_path, assets, caplog):
    with caplog.at_level(logging.WARNING, logger="tunedeck"):
        app = App(tmp_path / "ws", assets, **TEAM, TUNEDECK_OPEN_READ="true").start()
    try:
        assert app.api.get("/api/jobs").status_code == 200  # given explicitly: reads open
    finally:
        app.stop()
    (said,) = [r.getMessage() for r in caplog.records if "TUNEDECK_OPEN_READ=true" in r.getMessage()]
    assert "ANYONE WHO CAN REACH THIS PORT" in said and "--role viewer" in said


def test_an_app_found_listening_off_loopback_closes_reads_left_unset(tmp_path, assets, caplog):
    """Under plain uvicorn TUNEDECK_HOST may still say 127.0.0.1: the guard's finding decides. In this
    process no socket listens, so the guard judges by the address the request came to."""
    for given, status in ((None, 401), ("true", 200)):
        env = {"TUNEDECK_OPEN_WRITE": "false", **({"TUNEDECK_OPEN_READ": given} if given else {})}
        app = App(tmp_path / f"ws-{given}", assets, **env).start()
        try:
            with caplog.at_level(logging.WARNING, logger="tunedeck"):
                assert app.api.get("/api/jobs").status_code == 200  # on loopback: open
                exposed = TestClient(app.app, base_url="http://10.1.2.3")
                assert exposed.get("/api/jobs").status_code == status
                assert exposed.get("/api/health").status_code == 200
        finally:
            app.stop()
        warned = [r for r in caplog.records if "ANYONE WHO CAN REACH THIS PORT" in r.getMessage()]
        assert len(warned) == (given is not None)
        caplog.clear()

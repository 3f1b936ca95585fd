"""Team presets on the app itself (save, list, read, delete; owners and the shipped ones' read-only
rule), the chat proxy's key on an open server, and the CLI's `presets` verbs against a real server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.utils.factories import create_token
from tests.utils.servers import demo_config

# The fuzzer's find: control characters and (paired) surrogates in the YAML text were a 500.
FUZZED = "\u00bb\u0090N\U00089e79\u001e\u00c7\U0005afe0"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def demo_yaml(assets, **overrides) -> str:
    return yaml.safe_dump(demo_config(assets, **overrides), sort_keys=False)


@pytest.fixture
def app(app_factory):
    return app_factory()


def test_a_saved_preset_is_listed_read_and_deleted_beside_the_shipped_ones(app, assets):
    text = demo_yaml(assets, learning_rate=3e-4)
    r = app.api.post("/api/presets", json={"name": "team-sft", "description": "our SFT", "text": text})
    assert r.status_code == 201, r.text
    saved = r.json()
    assert (saved["name"], saved["source"], saved["owner"], saved["text"]) == ("team-sft", "team", None, text)
    assert saved["created_at"]
    listed = {p["name"]: p for p in app.api.get("/api/presets").json()}
    assert listed["team-sft"]["description"] == "our SFT" and listed["team-sft"]["source"] == "team"
    assert listed["demo_cpu"]["source"] == listed["ds_z3_rocm"]["source"] == "shipped"
    assert (listed["demo_cpu"]["kind"], listed["ds_z3_rocm"]["kind"]) == ("yaml", "json")
    assert app.api.get("/api/presets/team-sft").json()["text"] == text
    # What it holds is what a YAML submit accepts.
    job = app.api.post("/api/jobs/yaml", params={"name": "from preset", "gpus": 0}, content=text)
    assert job.status_code == 201, job.text

    again = app.api.post("/api/presets", json={"name": "team-sft", "text": text})
    assert again.status_code == 409 and "exists" in again.json()["detail"]
    shipped = app.api.post("/api/presets", json={"name": "demo_cpu", "text": text})
    assert shipped.status_code == 409 and "shipped" in shipped.json()["detail"]
    kept = app.api.delete("/api/presets/demo_cpu")
    assert kept.status_code == 409 and "read-only" in kept.json()["detail"]
    assert "max_steps" in app.api.get("/api/presets/demo_cpu").json()["text"]

    gone = app.api.delete("/api/presets/team-sft")
    assert gone.status_code == 200 and gone.json()["name"] == "team-sft"
    assert app.api.get("/api/presets/team-sft").status_code == 404
    assert app.api.delete("/api/presets/team-sft").status_code == 404
    assert "team-sft" not in {p["name"] for p in app.api.get("/api/presets").json()}


def test_a_preset_is_refused_as_its_yaml_submit_would_be(app, assets):
    for bad in (
        demo_yaml(assets, max_steps=-3),  # lint
        demo_yaml(assets, learning_rat=1),  # an unknown key
        demo_yaml(assets, dataset_dir="/etc"),  # outside the allowed roots
        "deepspeed: 5\nstage: sft\n",  # the spec's own shape
        "a: [1, 2\n",  # not YAML
    ):
        as_submit = app.api.post("/api/jobs/yaml", params={"name": "x", "gpus": 0}, content=bad)
        as_preset = app.api.post("/api/presets", json={"name": "p", "text": bad})
        assert as_submit.status_code == as_preset.status_code == 422, (bad, as_preset.text)
        assert as_preset.json()["detail"] == as_submit.json()["detail"], bad
    assert app.api.get("/api/presets/p").status_code == 404

    for text in (FUZZED, "stage: sft\n\x07", "\x00"):
        r = app.api.post("/api/presets", json={"name": "l", "text": text})
        assert r.status_code == 422, (text, r.text)
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "text"]], r.text
    lone = app.api.post(
        "/api/presets",
        content=b'{"name": "l", "text": "stage: sft\\n\\ud800"}',
        headers={"Content-Type": "application/json"},
    )
    assert lone.status_code == 422 and lone.json()["detail"][0]["loc"][:2] == ["body", "text"], lone.text
    for body, field in (
        ({"name": "../x", "text": "a: 1"}, "name"),
        ({"name": "ok", "text": ""}, "text"),
        ({"name": "ok", "text": "a: 1", "description": "x" * 501}, "description"),
        ({"name": "ok", "text": "a: 1", "owner": "me"}, "owner"),
    ):
        r = app.api.post("/api/presets", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text


def test_owners_and_admins_delete_team_presets_and_viewers_save_none(app_factory, assets):
    app = app_factory(TUNEDECK_OPEN_WRITE="false")
    alice, bob = (bearer(create_token(app.engine, n)) for n in ("alice", "bob"))
    admin = bearer(create_token(app.engine, "root", "admin"))
    viewer = bearer(create_token(app.engine, "wall", "viewer"))
    text = demo_yaml(assets)
    assert app.api.post("/api/presets", json={"name": "x", "text": text}).status_code == 401
    assert app.api.post("/api/presets", json={"name": "x", "text": text}, headers=viewer).status_code == 403
    for name in ("mine", "other"):
        r = app.api.post("/api/presets", json={"name": name, "text": text}, headers=alice)
        assert r.status_code == 201 and r.json()["owner"] == "alice", r.text
    listed = {p["name"]: p["owner"] for p in app.api.get("/api/presets", headers=viewer).json()}
    assert listed["mine"] == listed["other"] == "alice"
    refused = app.api.delete("/api/presets/mine", headers=bob)
    assert refused.status_code == 403 and "alice" in refused.json()["detail"]
    assert app.api.delete("/api/presets/mine", headers=viewer).status_code == 403
    assert app.api.delete("/api/presets/mine", headers=alice).status_code == 200
    assert app.api.delete("/api/presets/other", headers=admin).status_code == 200
    assert app.api.delete("/api/presets/demo_cpu", headers=admin).status_code == 409
    assert {p["source"] for p in app.api.get("/api/presets", headers=viewer).json()} == {"shipped"}


def test_the_open_chat_proxy_takes_any_key_that_is_no_tunedeck_token(app_factory):
    app = app_factory()
    assert app.api.get("/api/health").json()["chat_idle_s"] == app.settings.chat_idle_s
    path = "/api/jobs/999/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # The stock OpenAI client sends its key, whatever it is: past the guard, to the route (no such job).
    for headers in ({}, bearer("sk-anything"), bearer("EMPTY")):
        assert app.api.post(path, json=body, headers=headers).status_code == 404, headers
        assert app.api.get("/api/jobs/999/v1/models", headers=headers).status_code == 404, headers
    assert app.api.post(path, json=body, headers=bearer("tdk_not-a-token")).status_code == 401
    # Elsewhere a key is a token, and a wrong one is refused.
    assert app.api.get("/api/jobs", headers=bearer("sk-anything")).status_code == 401


def test_a_closed_chat_proxy_still_wants_a_token(app_factory):
    app = app_factory(TUNEDECK_OPEN_WRITE="false")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = app.api.post("/api/jobs/999/v1/chat/completions", json=body, headers=bearer("sk-anything"))
    assert r.status_code == 401


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_presets_verbs_and_the_chat_note_against_a_real_server(server_factory, assets, tmp_path):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_CHAT_IDLE_S="600")
    env = {**os.environ, "TUNEDECK_SERVER_URL": server.url}
    env.pop("TUNEDECK_TOKEN", None)
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(demo_yaml(assets))
    bad.write_text(demo_yaml(assets, max_steps=-3))

    saved = cli("presets", "save", "team-sft", str(good), "--description", "our LoRA SFT", env=env)
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.strip() == "saved preset team-sft (owner none)"
    refused = cli("presets", "save", "broken", str(bad), env=env)
    assert refused.returncode == 1 and "error: config.max_steps:" in refused.stderr, refused.stderr
    listed = cli("presets", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert "broken" not in rows
    assert rows["team-sft"].split()[1:4] == ["yaml", "team", "-"] and rows["team-sft"].endswith(
        "our LoRA SFT"
    )
    assert rows["demo_cpu"].split() == ["demo_cpu", "yaml", "shipped"]
    submitted = cli("submit", "--preset", "team-sft", "--gpus", "0", env=env)
    assert submitted.returncode == 0 and submitted.stdout.startswith("submitted job "), submitted.stderr
    kept = cli("presets", "delete", "demo_cpu", env=env)
    assert kept.returncode == 1 and "read-only" in kept.stderr, kept.stderr
    gone = cli("presets", "delete", "team-sft", env=env)
    assert gone.returncode == 0 and gone.stdout.strip() == "deleted preset team-sft", gone.stderr
    assert "team-sft" not in cli("presets", "list", env=env).stdout

    chat = tmp_path / "chat.yaml"
    chat.write_text(yaml.safe_dump({"model_name_or_path": str(assets / "demo" / "model")}))
    started = cli("submit", str(chat), "--kind", "chat", "--gpus", "0", env=env)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.split()[2]
    assert f"until it is stopped (tunedeck cancel {job_id}) or has had no request for 10 minutes" in (
        started.stderr
    ), started.stderr

"""Bad input gets a 422 at the field, never a 500, through a real server (launches held)."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from tests.security.test_auth import bearer, token
from tests.utils.servers import Server, demo_config

YAML = {"content-type": "application/yaml"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    s = Server(tmp_path_factory.mktemp("bad-input") / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true")
    s.start()
    yield s
    s.stop()


def post(server: Server, path: str, **kw) -> httpx.Response:
    # A fresh connection each time: a 500 closes the connection it was sent on.
    with httpx.Client(base_url=server.url, timeout=60, headers={"X-Tunedeck": "1"}) as c:
        return c.post(path, **kw)


def only(r: httpx.Response, loc: list) -> dict:
    assert r.status_code == 422, r.text
    found = [d for d in r.json()["detail"] if d["loc"] == loc]
    assert found, r.json()["detail"]
    return found[0]


def test_job_names_follow_one_rule_on_every_route(server, assets):
    train_yaml = yaml.safe_dump(demo_config(assets))
    for name in ("<img src=x>", "a/b", "é", "../x", " lead"):
        r = post(server, "/api/jobs/yaml", params={"name": name}, content=train_yaml, headers=YAML)
        assert "pattern" in only(r, ["query", "name"])["msg"]
        r = post(server, "/api/jobs", json={"name": name, "config": demo_config(assets)})
        only(r, ["body", "name"])
        r = post(
            server,
            "/api/runs/import",
            files={"trainer_log": b'{"current_steps": 1, "loss": 1.0}\n'},
            data={"name": name},
        )
        only(r, ["body", "name"])
    r = post(server, "/api/jobs/yaml", params={"name": "fine name_1.0+x"}, content=train_yaml, headers=YAML)
    assert r.status_code == 201, r.text


def test_yaml_values_json_cannot_carry_are_refused_at_the_key(server, assets):
    not_utf8 = "tokenized_path: !!binary /w==\n"  # the single byte 0xff
    for path, params in (("/api/ui/parse-yaml", {}), ("/api/jobs/yaml", {"name": "binary"})):
        r = post(server, path, params=params, content=not_utf8, headers=YAML)
        assert "binary" in only(r, ["config", "tokenized_path"])["msg"]
        r = post(server, path, params=params, content='template: "\\ud800"\n', headers=YAML)
        assert "surrogate" in only(r, ["config", "template"])["msg"]
    train_yaml = yaml.safe_dump(demo_config(assets, deepspeed=5))
    r = post(server, "/api/jobs/yaml", params={"name": "ds"}, content=train_yaml, headers=YAML)
    only(r, ["config", "deepspeed"])


def test_lone_surrogates_in_a_json_config_are_refused(server, assets):
    # Python's JSON writer escapes what it is given: the lone surrogate goes in as the escape text.
    value = json.dumps({"name": "s", "config": demo_config(assets, run_name="@@")}).replace(
        '"@@"', r'"\ud800"'
    )
    key = json.dumps({"name": "s", "config": demo_config(assets, **{"@@": 1})}).replace('"@@"', r'"\ud800"')
    for body, where in ((value, "run_name"), (key, "a key of config")):
        for path in ("/api/jobs", "/api/lint", "/api/ui/preview"):
            d = only(post(server, path, content=body.encode(), headers=JSON), ["body", "config"])
            assert where in d["msg"] and "surrogate" in d["msg"]


def test_a_stream_cursor_beyond_64_bits_is_a_422(server):
    huge = "m9223372036854775808-l0-s0-a0-j0"
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for params, headers, loc in (
            ({"cursor": huge}, {}, ["query", "cursor"]),
            ({}, {"Last-Event-ID": huge}, ["header", "last-event-id"]),
            ({"cursor": "m" + "9" * 5000 + "-l0-s0-a0-j0"}, {}, ["query", "cursor"]),
        ):
            with c.stream("GET", "/api/stream", params=params, headers=headers) as r:
                assert r.status_code == 422
                r.read()
                assert r.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(
    "key, value",
    [
        ("learning_rate", ".nan"),
        ("learning_rate", ".inf"),
        ("learning_rate", "-1.0e-4"),
        ("max_steps", "1.0e+30"),
        ("per_device_train_batch_size", "-2"),
        ("gradient_accumulation_steps", "0"),
        ("seed", "-1"),
        ("lora_dropout", "1.5"),
    ],
)
def test_values_the_trainer_would_choke_on_are_refused_at_the_key(server, assets, key, value):
    train_yaml = yaml.safe_dump(demo_config(assets)) + f"{key}: {value}\n"
    r = post(server, "/api/jobs/yaml", params={"name": "range"}, content=train_yaml, headers=YAML)
    d = only(r, ["config", key])
    assert d["code"] == "LF003" and f"`{key}` must be" in d["msg"]


def test_a_spec_with_too_many_keys_is_refused_before_the_work(server, assets):
    many = {f"key_{i}": i for i in range(100_000)}
    for path in ("/api/lint", "/api/estimate", "/api/ui/preview", "/api/jobs"):
        r = post(server, path, json={"name": "many", "config": {**demo_config(assets), **many}})
        assert "TUNEDECK_SPEC_MAX_KEYS" in only(r, ["config"])["msg"]
    r = post(
        server,
        "/api/lint",
        json={"name": "many", "config": demo_config(assets), "deepspeed": {"zero_optimization": many}},
    )
    assert "TUNEDECK_SPEC_MAX_KEYS" in only(r, ["config"])["msg"]
    flow = "lora_target: [" + ",".join(["q"] * 300_000) + "]\n"
    for path, params in (("/api/ui/parse-yaml", {}), ("/api/jobs/yaml", {"name": "many"})):
        r = post(server, path, params=params, content=flow, headers=YAML)
        assert "TUNEDECK_SPEC_MAX_KEYS" in only(r, ["config"])["msg"]


def test_viewers_may_use_the_pure_computations(server_factory, assets, tmp_path):
    ws = tmp_path / "ws"
    viewer = bearer(token(ws, "wall", "viewer"))
    server = server_factory(
        TUNEDECK_OPEN_READ="false", TUNEDECK_OPEN_WRITE="false", TUNEDECK_LAUNCH_PAUSED="true"
    )
    spec = {"name": "look", "config": demo_config(assets), "gpus": 0}
    train_yaml = yaml.safe_dump(demo_config(assets))
    assert (
        post(server, "/api/ui/parse-yaml", content=train_yaml, headers={**YAML, **viewer}).status_code == 200
    )
    for path in ("/api/ui/preview", "/api/lint", "/api/estimate"):
        r = post(server, path, json=spec, headers=viewer)
        assert r.status_code == 200, (path, r.text)
        assert post(server, path, json=spec).status_code == 401  # reads still need a token here
    assert post(server, "/api/jobs", json=spec, headers=viewer).status_code == 403
    r = post(
        server, "/api/jobs/yaml", params={"name": "look"}, content=train_yaml, headers={**YAML, **viewer}
    )
    assert r.status_code == 403

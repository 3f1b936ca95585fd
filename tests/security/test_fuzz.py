"""Fuzz the whole OpenAPI of a real server with schemathesis (bounded): no 5xx, no stored garbage."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings

from tests.conftest import OUTPUT, Server

schemathesis = pytest.importorskip("schemathesis")
TALLY = {"requests": 0, "failures": 0, "by_status": {}}
EXAMPLES = int(os.environ.get("TUNEDECK_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, assets):
    # Launches paused: fuzzed specs that happen to be valid stay queued instead of training.
    server = Server(tmp_path_factory.mktemp("fuzz") / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true",
                    TUNEDECK_MAX_BODY_BYTES="262144")
    server.start()
    yield server
    server.stop()
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "fuzz.json").write_text(json.dumps(TALLY, indent=2))
    print(f"\nschemathesis: {TALLY['requests']} requests, {TALLY['failures']} server errors, "
          f"statuses {TALLY['by_status']}")


def test_no_server_errors(fuzz_server):
    """Every operation, `EXAMPLES` generated cases each (schemathesis' pytest plugin does not run on
    this pytest, so its strategies are driven with hypothesis directly)."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):  # noqa: ANN001
            response = case.call(timeout=30, headers={"X-Tunedeck": "1"})  # what every client of ours sends
            TALLY["requests"] += 1
            TALLY["by_status"][response.status_code] = TALLY["by_status"].get(response.status_code, 0) + 1
            if response.status_code >= 500:
                TALLY["failures"] += 1
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}")

        run()
    assert TALLY["requests"] > 0
    assert failures == []


def test_nothing_stored_is_garbage(fuzz_server):
    """Whatever the fuzzer got accepted is a well-formed job whose files sit inside the workspace."""
    db = sqlite3.connect(fuzz_server.workspace / "tunedeck.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    runs = (fuzz_server.workspace / "runs").resolve()
    for name, train_yaml, run_dir, status in db.execute("SELECT name, train_yaml, run_dir, status FROM jobs"):
        assert status in ("queued", "cancelled") or (status == "succeeded" and run_dir)  # an import
        config = yaml.safe_load(train_yaml)
        assert isinstance(config, dict) and Path(config["output_dir"]).resolve().is_relative_to(runs)
        assert Path(run_dir).resolve().parent == runs
        assert 0 < len(name) <= 100

"""Real LLaMA-Factory runs of the tiny demo model (tests/alerts/traces/, recorded by
scripts/record_traces.py, labelled from what each run's log shows): the engine raises what each run
did, and nothing on a healthy one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tunedeck.alerts import KINDS, analyze
from tunedeck.alerts.rundir import read_run_dir

TRACES = Path(__file__).parent / "traces"
FOLDERS = sorted(p for p in TRACES.iterdir() if (p / "labels.json").is_file())
ROOT = Path(__file__).resolve().parents[2]


def recorder():
    spec = importlib.util.spec_from_file_location("record_traces", ROOT / "scripts" / "record_traces.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_labelled_alerts_fire_and_nothing_else(folder):
    labels = json.loads((folder / "labels.json").read_text())
    memory = folder / "memory.csv"
    series = read_run_dir(folder, memory=memory if memory.is_file() else None)
    raised = {f.kind for f in analyze(series) if f.severity != "info"}
    did = set(labels["kinds"])
    assert did & set(KINDS) <= raised, (labels["kinds"], raised)
    assert raised <= did, (labels["kinds"], raised)
    if labels["healthy"]:
        assert not raised


def test_labels_are_what_the_logs_show():
    label = recorder().label
    for folder in FOLDERS:
        kept = json.loads((folder / "labels.json").read_text())
        assert label((folder / "trainer_log.jsonl").read_text())["kinds"] == kept["kinds"], folder.name


def test_the_set_covers_healthy_stuck_diverged_and_fp16():
    kinds = {k for p in FOLDERS for k in json.loads((p / "labels.json").read_text())["kinds"]}
    healthy = [p.name for p in FOLDERS if json.loads((p / "labels.json").read_text())["healthy"]]
    assert {"loss_stuck", "loss_divergence"} <= kinds and len(healthy) >= 2
    assert any(json.loads((p / "labels.json").read_text())["overrides"].get("fp16") for p in FOLDERS)

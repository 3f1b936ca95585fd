"""A field that a table and an API answer share is declared once, in the base both derive from
(store/tables.py), and the answer's schema still promises what it promised before the bases."""

from __future__ import annotations

import inspect

import pytest

from tunedeck import schemas
from tunedeck.store import tables

# (table, base, answer, the fields the answer declares again: what it answers otherwise than the row holds)
PAIRS = [
    (tables.Job, tables.JobBase, schemas.JobOut, {"id", "devices", "tags"}),
    (tables.Job, tables.JobProgress, schemas.Progress, set()),
    (tables.MetricPoint, tables.MetricBase, schemas.MetricOut, {"id", "nonfinite", "extra"}),
    (tables.LogLine, tables.LogBase, schemas.LogOut, {"id"}),
    (tables.MemorySample, tables.MemoryBase, schemas.MemorySampleOut, {"id"}),
    (tables.Alert, tables.AlertBase, schemas.AlertOut, {"id", "change"}),
    (tables.TeamPreset, tables.PresetBase, schemas.Preset, {"created_at"}),
]


def declared(model: type) -> set[str]:
    """The fields a class annotates itself, not those it inherits."""
    return set(inspect.get_annotations(model))


@pytest.mark.parametrize("table, base, answer, overrides", PAIRS, ids=lambda p: getattr(p, "__name__", ""))
def test_a_field_of_a_row_and_of_its_answer_is_declared_once_in_their_base(table, base, answer, overrides):
    assert issubclass(table, base) and issubclass(answer, base)
    # What both have, they have from the base: a column added to the table and to the answer is not.
    assert set(table.model_fields) & set(answer.model_fields) == set(base.model_fields)
    assert declared(table) & set(base.model_fields) == set()
    assert declared(answer) & set(base.model_fields) == overrides


# What each row's answer required before the shared bases (the base's defaults are a new row's).
REQUIRED = {
    schemas.JobOut: {"id", "name", "owner", "status", "gpus", "devices", "exit_code", "error"}
    | {"created_at", "started_at", "finished_at", "progress", "run_dir", "output_dir", "verdict"},
    schemas.MetricOut: {"id", "step", "t", "loss", "eval_loss", "lr", "epoch", "throughput", "total_tokens"}
    | {"vram_allocated", "vram_reserved"},
    schemas.LogOut: {"id", "t", "stream", "text"},
    schemas.MemorySampleOut: {"id", "t", "gpu", "used_bytes", "total_bytes", "util", "power_w", "temp_c"},
    schemas.AlertOut: {"id", "job_id", "kind", "severity", "gpu", "t", "step", "message", "suggestion"}
    | {"open", "first_t", "last_t", "count"},
    schemas.Preset: {"name", "owner", "description", "kind", "source"},
}


@pytest.mark.parametrize("answer", REQUIRED, ids=lambda a: a.__name__)
def test_an_answer_requires_what_it_required_before_its_fields_moved_to_a_base(answer):
    schema = answer.model_json_schema(mode="serialization")
    assert set(schema["required"]) == REQUIRED[answer]
    assert [n for n in schema["required"] if "default" in schema["properties"][n]] == []

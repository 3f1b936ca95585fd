"""Slurm's time formats as sbatch(1) reads them, which the submit check compares with a partition's
MaxTime (the real-cluster refusal is in tests/slurm/test_slurm_jobs.py)."""

from __future__ import annotations

import pytest

from tunedeck.scheduling.executors.slurm.cluster import seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", 4 * 60),  # minutes
        ("90", 90 * 60),
        ("1:30", 90),  # minutes:seconds
        ("01:00:00", 3600),
        ("00:05:00", 300),  # how scontrol prints a partition's MaxTime
        ("1-2", 26 * 3600),  # days-hours
        ("1-02:30", 26 * 3600 + 30 * 60),
        ("1-02:30:15", 26 * 3600 + 30 * 60 + 15),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("", None),
        ("soon", None),
    ],
)
def test_slurm_times_in_seconds(text, expected):
    assert seconds(text) == expected

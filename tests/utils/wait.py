"""The one way tests wait: poll a condition until it holds, with a generous deadline.

A deadline only bounds a hang; no test asserts how long anything took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# The calls that pause a test and the clocks that time one: only until() below may use them
# (tests/test_test_style.py reads every other test module for them).
PAUSES = frozenset({"sleep", "wait_for_timeout"})
CLOCKS = frozenset({"monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns"})
# Bounds a hang, for until() and for waits on an event or a future (`.result(timeout=DEADLINE)`).
DEADLINE = 120.0
# Bounds a stage of a real (multi-rank, multi-node) fine-tune: at load 20 a 300 s wait for a 2-node
# job's first points starved. Used only in modules whose own pytest timeout (1800 s) leaves room.
RUN_DEADLINE = 900.0


def until(
    check: Callable[[], T],
    what: str,
    timeout: float = DEADLINE,
    interval: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> T:
    """`check()`'s first truthy value; AssertionError naming `what` if none came before the deadline,
    with `explain()`'s account of where things stood (a job's status and last log lines, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = ""
            if explain is not None:
                try:
                    said = "\n" + explain()
                except Exception as e:  # the account must not hide the timeout itself
                    said = f"\n(no account: {e!r})"
            raise AssertionError(f"no {what} after {timeout:g} s{said}")
        time.sleep(interval)

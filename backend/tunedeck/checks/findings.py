"""What every check reports: a finding `{"code", "severity", "path", "message", "fix"}`.

Codes are stable (the UI and scripts may key on them) and each rule family lists its own in its
module's docstring, one table row per code: lint.py (LF001-LF008, DS, HW), reach.py (paths, the
network, remote code, pickles), catalog.py (datasets and templates). `tests/lint/test_codes.py` holds
every emitted code to one row. Paths name the key (`config.fp16`, `deepspeed.zero_optimization.x`,
`gpus`).
"""

from __future__ import annotations

from typing import Any

Finding = dict[str, Any]
SEVERITIES = ("error", "warning", "info")


def finding(*, code: str, severity: str, path: str, message: str, fix: str) -> Finding:
    assert severity in SEVERITIES
    return {"code": code, "severity": severity, "path": path, "message": message, "fix": fix}


def as_error(f: Finding) -> dict[str, Any]:
    """A finding as a FastAPI-style 422 detail item, located at the key."""
    return {
        "loc": f["path"].split("."),
        "msg": f"{f['code']}: {f['message']} — fix: {f['fix']}",
        "type": "lint_error",
        "code": f["code"],
    }

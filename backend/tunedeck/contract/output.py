"""What one line of a trainer's output is once cleaned: what a terminal would show of it. The runner
cleans what it reads this way, and an import cleans an outside run's log the same way."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str) -> str:
    """What a terminal would show of one output line: last carriage-return segment, no escapes."""
    text = ANSI.sub("", text)
    segments = [s for s in text.split("\r") if s.strip()]
    text = segments[-1] if segments else ""
    return CONTROL.sub("", text).rstrip()

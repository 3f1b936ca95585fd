"""The package as a wheel lays it out: backend/tunedeck with the checkout's top-level pages, presets
and migrations inside it (pyproject maps them onto tunedeck.frontend, .configs, .migrations)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "backend" / "tunedeck"
SHIPPED = ("frontend", "configs", "migrations")  # top-level folders that ship inside the package


def assemble(dest: Path, *, ignore: tuple[str, ...] = ("__pycache__",)) -> Path:
    """A copy of the package at `dest` (a folder named tunedeck) with the shipped folders inside it."""
    skip = shutil.ignore_patterns(*ignore)
    shutil.copytree(PACKAGE, dest, ignore=skip)
    for name in SHIPPED:
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest

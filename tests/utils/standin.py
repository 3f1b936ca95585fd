"""A training environment whose trainer only waits: for tests and benchmarks of the runner itself.

The runner starts `llamafactory-cli` from the training python's folder; here that is a script that
waits for a `stop` file in its run folder and exits 0, and the test (or benchmark) writes the
trainer_log.jsonl lines LLaMA-Factory would. The python is the real one, so the runner is real.
"""

from __future__ import annotations

import sys
from pathlib import Path


def stand_in_trainer(folder: Path) -> Path:
    """The training python to set as TUNEDECK_TRAIN_PYTHON."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    cli = folder / "llamafactory-cli"
    cli.write_text("#!/bin/sh\necho stand-in trainer: waiting for ./stop\nwhile [ ! -e stop ]; do sleep 0.1; done\n")
    for f in (python, cli):
        f.chmod(0o755)
    return python

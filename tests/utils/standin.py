"""A training environment whose `llamafactory-cli` is a stand-in: the real runner, a trainer we steer.

The runner starts `<TUNEDECK_TRAIN_PYTHON> <tunedeck_train>/lf_train.py train.yaml`, so a folder with a
`python` that is this interpreter (but hands lf_train.py to the stand-in) and a stand-in
`llamafactory-cli` beside it runs every part of
tunedeck for real except the training. The stand-in writes the environment it was given to
`trainer-env.json` in its run folder and then acts by the job's name (its run folder's name):
- `stubborn`: ignores SIGABRT and SIGTERM, says so, and waits for a SIGKILL;
- `held`: makes the FIFO `release` in its run folder, prints `first line`, blocks until a writer
  opens the FIFO (`release(run_dir)`), prints `last line` and exits 0;
- `phased`: prints the start of an op build (torch's line, on stderr as torch's logger writes it),
  makes the FIFO `release`, blocks like `held`, then prints the build's end and "Running training"
  (transformers' line, stderr too) and exits 0;
- anything else: prints `stand-in step 1..3` and exits 0.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

from tests.utils.wait import until

TRAINER = """#!{python}
import json, os, signal, sys
from pathlib import Path

Path("trainer-env.json").write_text(json.dumps(dict(os.environ)))
name = Path.cwd().name
if "stubborn" in name:
    signal.signal(signal.SIGABRT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("stand-in ignores SIGABRT and SIGTERM", flush=True)
    while True:
        signal.pause()
if "phased" in name:  # an op build's lines (torch's), held like `held`, then training (transformers')
    print("Building extension module cpu_adam...", file=sys.stderr, flush=True)
    os.mkfifo("release")
    with open("release") as fifo:
        fifo.read(1)
    print("Loading extension module cpu_adam...", file=sys.stderr, flush=True)
    print("[INFO|trainer.py:1469] 2026-12-03 06:08:39,506 >> ***** Running training *****", file=sys.stderr, flush=True)
    sys.exit(0)
if "held" in name:
    os.mkfifo("release")
    print("first line", flush=True)
    with open("release") as fifo:  # blocks until the test opens it for writing
        fifo.read(1)
    print("last line", flush=True)
    sys.exit(0)
for i in range(1, 4):
    print(f"stand-in step {{i}}", flush=True)
"""


def training_env(folder: Path) -> Path:
    """The stand-in environment in `folder`; returns its python, for TUNEDECK_TRAIN_PYTHON."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python"
    # The runner starts training as `python .../tunedeck_train/lf_train.py train.yaml`: that goes to the stand-in.
    python.write_text(
        "#!/bin/sh\n"
        f'case "$1" in *lf_train.py) shift; exec {json.dumps(str(folder / "llamafactory-cli"))} train "$@";; esac\n'
        f'exec {json.dumps(sys.executable)} "$@"\n'
    )
    cli = folder / "llamafactory-cli"
    cli.write_text(TRAINER.format(python=sys.executable))
    for f in (python, cli):
        f.chmod(0o755)
    return python


def release(run_dir: Path) -> None:
    """Lets the `held` stand-in in `run_dir` finish."""
    release_fifo(run_dir / "release")


def release_fifo(fifo: Path) -> None:
    """Opens `fifo` for writing once a stand-in blocks reading it, and writes a byte: that wakes it."""

    def opened() -> tuple[int] | None:
        # Non-blocking: with no reader yet the open fails (ENXIO) instead of hanging the test.
        try:
            return (os.open(fifo, os.O_WRONLY | os.O_NONBLOCK),)  # a tuple: fd 0 would read as false
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENXIO):
                return None
            raise

    (fd,) = until(opened, f"a stand-in reading {fifo}")
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)

"""Two CPU ranks of a script under a real `torchrun` on this host (gloo), for the tests that drive
what ranks do to each other: a collective check, a rank killed after they met."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.utils.servers import free_port


def two_ranks(script: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2 script` on a free port, one thread a rank;
    its output captured, its exit code not checked."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        + ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

"""The runner's dumps, of real processes: a launcher and two ranks of a real torch.distributed (gloo)
group, rank 0 waiting in all_reduce for rank 1, which is stuck loading a batch from a real DataLoader.
py-spy reads each (without pausing it); the summary says where each rank waits. A rank stopped with
SIGSTOP is still read."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.utils.wait import until
from tunedeck.contract.stacks import summary
from tunedeck.runner import stacks

RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    here = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class Slow(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            (here / "loading").touch()
            time.sleep(3600)

    if rank == 0:
        (here / "reducing").touch()
        dist.all_reduce(torch.ones(1))  # rank 1 never comes
    else:
        next(iter(DataLoader(Slow())))
""")
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    ranks = [
        subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], env={**os.environ, "RANK": str(r)})
        for r in (0, 1)
    ]
    for p in ranks:
        p.wait()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hung(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    root = subprocess.Popen(
        [sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "rank.py"), str(tmp_path)],
        env=env,
        start_new_session=True,
    )
    yield root
    os.killpg(root.pid, signal.SIGKILL)
    root.wait()


def test_each_rank_is_dumped_and_placed_in_its_collective_or_its_data_loading(hung, tmp_path):
    until(
        lambda: (tmp_path / "loading").exists() and (tmp_path / "reducing").exists(),
        "both ranks at their wait",
    )

    def placed():
        report = stacks.collect(hung.pid, request=1, node="here", runner_rank=0)
        return report if summary([report]) == "rank 0 in all_reduce, rank 1 in data loading" else None

    report = until(placed, "rank 0 in all_reduce and rank 1 in data loading", interval=1.0)
    assert [p.rank for p in report.processes][:1] == [None]  # the launcher: no rank of its own
    assert {p.rank for p in report.processes} >= {0, 1} and not any(p.error for p in report.processes)
    rank0 = next(p for p in report.processes if p.rank == 0)
    assert rank0.threads and any(f.name == "all_reduce" for t in rank0.threads for f in t.frames)

    # A rank stopped outright (SIGSTOP) is read all the same: a blocking dump could not suspend it.
    rank1 = next(p for p in report.processes if p.rank == 1)
    os.kill(rank1.pid, signal.SIGSTOP)
    try:
        again = stacks.collect(hung.pid, request=2, node="here", runner_rank=0)
        assert summary([again]) == "rank 0 in all_reduce, rank 1 in data loading", again
    finally:
        os.kill(rank1.pid, signal.SIGCONT)


def test_no_trainer_is_said():
    assert stacks.collect(None, request=1, node="n", runner_rank=0).error == "no trainer process runs"

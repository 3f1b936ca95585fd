"""The runner's dumps, of real processes: a launcher and two ranks of a real torch.distributed (gloo)
group, rank 0 waiting in all_reduce for rank 1, which is stuck loading a batch from a real DataLoader.
py-spy reads each (without pausing it); the summary says where each rank waits. A rank stopped with
SIGSTOP is still read."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.utils.servers import free_port
from tests.utils.wait import until
from tunedeck.contract.stacks import flight_summary, summary
from tunedeck.runner import stacks

RANK = textwrap.dedent("""
    import os, sys, threading
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
            threading.Event().wait()  # stuck loading until the test kills it

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


def test_a_process_py_spy_cannot_read_is_said_with_py_spy_s_reason_and_a_python_one_is_read():
    spy = stacks.py_spy()
    if spy is None:
        pytest.skip("py-spy is not installed")
    # No Python in it (cat waits on its input): every read fails, each try says why.
    other = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    python = subprocess.Popen([sys.executable, "-c", "import threading\nthreading.Event().wait()"])
    try:
        got = stacks.dump_process(other.pid, spy, tries=2)
        assert "threads" not in got and got["error"].startswith("py-spy"), got
        read = until(lambda: stacks.dump_process(python.pid, spy).get("threads"), "the Python process read")
        assert any(f["name"] == "<module>" for t in read for f in t["frames"]), read
    finally:
        for p in (other, python):
            p.kill()
            p.wait()


# Both ranks complete all_reduce #1; then rank 0 enters all_gather #2 and rank 1 never does (it loads a
# batch). The flight recorder is on (TORCH_FR_BUFFER_SIZE: gloo records too), and each rank answers the
# runner's requests from the thread lf_train.py starts in every real run.
FLIGHT_RANK = textwrap.dedent("""
    import os, sys, threading
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    from tunedeck_train.lf_train import start_flight_answers

    here = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    assert start_flight_answers(str(here))
    dist.all_reduce(torch.ones(2))

    class Slow(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            (here / "loading").touch()
            threading.Event().wait()  # stuck loading until the test kills it

    if rank == 0:
        (here / "gathering").touch()
        dist.all_gather([torch.zeros(3), torch.zeros(3)], torch.ones(3))  # rank 1 never comes
    else:
        next(iter(DataLoader(Slow())))
""")


@pytest.fixture
def recorded(tmp_path):
    (tmp_path / "rank.py").write_text(FLIGHT_RANK)
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "TORCH_FR_BUFFER_SIZE": "100",
    }
    root = subprocess.Popen(
        [sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "rank.py"), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    yield root
    os.killpg(root.pid, signal.SIGKILL)
    root.wait()


def test_the_flight_recorder_names_the_collective_one_rank_never_entered(recorded, tmp_path):
    until(
        lambda: (tmp_path / "loading").exists() and (tmp_path / "gathering").exists(),
        "both ranks at their wait",
    )
    report = stacks.collect(recorded.pid, request=1, node="here", runner_rank=0, folder=tmp_path)
    said = flight_summary([report])
    assert said == "rank 0 in all_gather #2, not completed; rank 1 never entered #2 (completed #1)", report
    rank0 = next(p for p in report.processes if p.rank == 0 and p.flight)
    assert [(c.op, c.seq, c.sizes) for c in rank0.flight.pending] == [("all_gather", 2, [[3]])]
    assert rank0.flight.source == "asked"
    # The py-spy summary beside it is unchanged by the recorder's thread.
    assert summary([report]) == "rank 0 in all_gather, rank 1 in data loading", report

    # A rank stopped outright cannot answer: it is said, and the live rank's record still comes.
    rank1 = next(p for p in report.processes if p.rank == 1 and p.flight)
    os.kill(rank1.pid, signal.SIGSTOP)
    try:
        again = stacks.collect(recorded.pid, request=2, node="here", runner_rank=0, folder=tmp_path)
    finally:
        os.kill(rank1.pid, signal.SIGCONT)
    assert flight_summary([again]) == (
        "rank 0 in all_gather #2, not completed; rank 1 no flight record (it did not answer: a stopped or lost rank)"
    ), again


def test_torch_s_timeout_dump_is_read_as_plain_data_and_a_pickle_that_calls_is_refused(tmp_path):
    """torch's own dump (its pickle, made here by the real recorder of a 1-rank gloo group) is read;
    a file of the same name that would run code is refused before anything of it runs."""
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
                import os, sys, torch, torch.distributed as dist
                import torch._C._distributed_c10d as c10d
                dist.init_process_group("gloo", rank=0, world_size=1)
                dist.all_reduce(torch.ones(5))
                sys.stdout.buffer.write(c10d._dump_fr_trace())
            """),
        ],
        env={
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "TORCH_FR_BUFFER_SIZE": "10",
        },
        capture_output=True,
        check=True,
        timeout=300,
    )
    (tmp_path / "flight_recorder_rank_0").write_bytes(made.stdout)
    record = stacks.flight_records(tmp_path, [0], request=1, wait_s=0)[0]
    assert record.error is None and record.source == "torch's timeout dump flight_recorder_rank_0", record
    assert [(g.pg, g.last_enqueued, g.last_completed) for g in record.groups] == [("0", 1, 1)]

    class Calls:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "ran"),))

    (tmp_path / "flight_recorder_rank_1").write_bytes(pickle.dumps({"entries": [Calls()]}))
    refused = stacks.flight_records(tmp_path, [1], request=1, wait_s=0)[1]
    assert "builds more than plain data" in (refused.error or ""), refused
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ValueError, match="STACK_GLOBAL|GLOBAL"):
        stacks.plain_pickle(pickle.dumps(os.getcwd))

"""The cause a runner reports, read from real captured trainer output (tests/runner/outputs): torchrun
with two ranks (one raises after the process group is up, one is killed, one raises before it), and
LLaMA-Factory given a multimodal template for a text-only model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunedeck.contract.output import clean
from tunedeck.runner.causes import Causes, failure_cause

OUTPUTS = Path(__file__).parent / "outputs"


def output(name: str) -> list[str]:
    """The file's lines as a runner reads them (progress-bar redraws collapsed)."""
    return [c for c in (clean(x) for x in (OUTPUTS / name).read_text().split("\n")) if c]


def test_the_failed_ranks_exception_not_torchruns_wrapper():
    cause = failure_cause(output("torchrun_rank1_raises.txt"), 1)
    # Rank 1 failed first (torchrun says so); rank 0's "Connection closed by peer" is its consequence,
    # the FileNotFoundError only what the ValueError was raised while handling.
    assert cause == (
        "ValueError: Cannot open /data/team/dataset_info.json due to [Errno 2] No such file or directory: "
        "'/data/team/dataset_info.json'. (at /tmp/h30tr/boom2.py:10, in load; rank 1); "
        "ChildFailedError: rank 1 (local_rank 1, host localhost) failed first"
    ), cause


def test_a_killed_rank_is_the_cause_not_the_ranks_that_lost_it():
    cause = failure_cause(output("torchrun_rank1_killed.txt"), 1)
    assert cause == (
        "rank 1 (local_rank 1, host localhost) was killed by SIGKILL; "
        "ChildFailedError: rank 1 (local_rank 1, host localhost) failed first"
    ), cause


def test_unprefixed_tracebacks_before_the_process_group():
    cause = failure_cause(output("torchrun_unprefixed.txt"), 1)
    assert cause.startswith("ValueError: Cannot open /nonexistent/dataset_info.json due to [Errno 2]"), cause
    assert "(at /tmp/h30tr/boom.py:8, in load); ChildFailedError: rank 0 (local_rank 0" in cause, cause


def test_a_single_process_failure_names_the_library_frame():
    cause = failure_cause(output("lf_template_without_processor.txt"), 1)
    assert cause == (
        "ValueError: Processor was not found, please check and update your model file. "
        "(at llamafactory/data/mm_plugin.py:178, in _validate_input)"
    ), cause


@pytest.mark.parametrize(
    ("lines", "code", "cause"),
    [
        (["x", "ValueError: Undefined dataset foo in dataset_info.json.", "  "], 1, "ValueError: Undefined"),
        (
            ["torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2 GiB", "Traceback"],
            1,
            "out of memory",
        ),
        ([], -9, "killed by SIGKILL"),
        (["bye"], 3, "exited with code 3"),
        # An out-of-memory exception keeps its place; the output of other ranks after it changes nothing.
        (
            [
                "[rank0]: Traceback (most recent call last):",
                '[rank0]:   File "/x/site-packages/torch/nn/modules/linear.py", line 125, in forward',
                "[rank0]:     return F.linear(input, self.weight, self.bias)",
                "[rank0]: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
                "[rank1]: RuntimeError: Connection closed by peer",
            ],
            1,
            "out of memory: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. "
            "(at torch/nn/modules/linear.py:125, in forward; rank 0)",
        ),
    ],
)
def test_other_causes(lines, code, cause):
    assert failure_cause(lines, code).startswith(cause)


def test_interleaved_ranks_are_read_apart():
    """Two ranks' tracebacks line by line into one stream: each is read whole, by its prefix."""
    a = output("torchrun_rank1_raises.txt")
    ranked = [x for x in a if x.startswith("[rank")]
    rank0, rank1 = (
        [x for x in ranked if x.startswith("[rank0]")],
        [x for x in ranked if x.startswith("[rank1]")],
    )
    mixed = [x for pair in zip(rank0, rank1) for x in pair] + rank0[len(rank1) :] + rank1[len(rank0) :]
    torchrun = [x for x in a if not x.startswith("[rank")]
    causes = Causes()
    for line in mixed + torchrun:
        causes.feed(line)
    # Rank 0's traceback ended first here, but torchrun says rank 1 failed first: its exception is the cause.
    assert causes.cause(1).startswith("ValueError: Cannot open")
    assert causes.by_rank[1].text.startswith("ValueError: Cannot open") and causes.by_rank[1].line == 10
    assert (
        causes.by_rank[0].text.startswith("RuntimeError: [/__w/pytorch")
        and causes.by_rank[0].func == "barrier"
    )

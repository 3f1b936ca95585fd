"""The cause a runner reports, read from real captured trainer output (tests/runner/outputs): torchrun
with two ranks (one raises after the process group is up, one is killed, one raises before it),
LLaMA-Factory given a multimodal template for a text-only model, and LLaMA-Factory given a dataset
whose file is missing (its log lines on stdout, the traceback on stderr); and a killed rank driven under
a real torchrun here (tests/integration/test_slice.py drives the missing dataset and the bad template)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.utils.torchrun import two_ranks
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


MISSING = (
    "ValueError: File /srv/team/ws/data/gone.json not found. "
    "(at llamafactory/data/loader.py:82, in _load_single_dataset)"
)


def stream_of(line: str) -> str:
    """Where the captured line was written: LLaMA-Factory's logger writes to stdout (`[INFO|<date>]`),
    transformers' logger and Python's tracebacks to stderr."""
    return "stdout" if re.match(r"^\[(INFO|WARNING)\|\d{4}-", line) else "stderr"


def raced(lines: list[str], moved: str, after: str) -> list[str]:
    """The output as the runner's two reader threads may deliver it: the `moved` line (printed just
    before the traceback, on the other stream) read after the line `after` instead."""
    out = [x for x in lines if x != moved]
    at = next(i for i, x in enumerate(out) if x.strip().startswith(after))
    return [*out[: at + 1], moved, *out[at + 1 :]]


def test_the_missing_data_file_in_the_order_it_was_written():
    lines = output("lf_dataset_file_missing.txt")
    assert failure_cause(lines, 1) == MISSING
    causes = Causes()
    for line in lines:
        causes.feed(line, stream_of(line))
    assert causes.cause(1) == MISSING


@pytest.mark.parametrize(
    "after",
    [
        "Traceback (most recent call last):",  # before any frame: taken for the exception, once
        'File "/work/main/.venv/lib/python3.11/site-packages/llamafactory/data/loader.py", line 181',
        "ValueError: File",  # after the exception: it must not end the traceback's reading early
    ],
)
def test_a_log_line_read_inside_the_traceback_is_never_the_cause(after):
    """The run this sample is from reported "[INFO|...] llamafactory.data.loader:144 >> Loading dataset
    gone.json..." as its error once: LLaMA-Factory's last log line, read in the middle of the traceback."""
    lines = output("lf_dataset_file_missing.txt")
    (loading,) = [x for x in lines if "Loading dataset gone.json" in x]
    assert loading.startswith("[INFO|")
    assert failure_cause(raced(lines, loading, after), 1) == MISSING
    warning = "[WARNING|2026-12-02 15:18:26] llamafactory.data.loader:90 >> Dataset gone.json is empty."
    assert failure_cause(raced([*lines, warning], warning, after), 1) == MISSING


@pytest.mark.parametrize(
    "record",
    [
        "[INFO|hub.py:364] 2026-12-02 15:18:26,012 >> Offline mode: forcing local_files_only=True",
        "[2026-12-02 15:18:26,012] [WARNING] [stage3.py:2171:step] 1 pytorch allocator cache flushes since last step",
        "W1202 07:27:32.729000 24986 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
        "25009 closing signal SIGTERM",
        "WARNING:root:Error: the tokenizer has no pad token",
    ],
)
def test_a_log_record_between_chained_tracebacks_keeps_the_chain_whole(record):
    """Rank 1's FileNotFoundError is what its ValueError was raised while handling: a log record read
    between them must not end the chain there (the FileNotFoundError would become the cause)."""
    lines = output("torchrun_rank1_raises.txt")
    lines = raced([*lines, f"[rank1]: {record}"], f"[rank1]: {record}", "[rank1]: FileNotFoundError")
    assert failure_cause(lines, 1).startswith("ValueError: Cannot open /data/team/dataset_info.json"), lines


def test_printed_output_on_stdout_is_read_apart_from_the_traceback_on_stderr():
    """The Trainer prints its metrics (`{'loss': ...}`) to stdout, no log record: read on its own
    stream, it is no line of the traceback on stderr, wherever it lands."""
    lines = output("lf_dataset_file_missing.txt")
    printed = "{'loss': 5.9912, 'grad_norm': 1.204, 'learning_rate': 5e-05, 'epoch': 0.4}"
    causes = Causes()
    for line in raced([*lines, printed], printed, "Traceback (most recent call last):"):
        causes.feed(line, "stdout" if line == printed else stream_of(line))
    assert causes.cause(1) == MISSING
    # Read as one stream, the same order is ambiguous: the printed line ends the traceback's frames.
    assert (
        failure_cause(raced([*lines, printed], printed, "Traceback (most recent call last):"), 1) != MISSING
    )


def test_an_out_of_memory_error_record_counts_and_a_warning_does_not():
    lines = output("lf_dataset_file_missing.txt")
    warned = "[WARNING|2026-12-02 15:18:26] llamafactory.train.trainer:88 >> retrying: CUDA out of memory"
    assert failure_cause([warned, *lines], 1) == MISSING
    failed = "E1202 07:27:32.844000 24986 torch/csrc/x.cpp:12] HIP out of memory. Tried to allocate 2.00 GiB"
    assert failure_cause([failed, *lines], 1).startswith("out of memory: ")


# Rank 1 is killed once both have met; rank 0 then waits where no broken connection ends it, so torchrun
# (which stops it) and not a race between the two exits decides which rank failed first.
KILLED = """
import os, signal, threading
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a rank: no traceback of its own
threading.Event().wait()
"""


def test_a_rank_killed_under_a_real_torchrun_is_the_cause(tmp_path):
    """Driven, not captured: two gloo ranks under torchrun, rank 1 killed after they met. The cause is
    rank 1's SIGKILL, not the rank torchrun stopped after it, with torchrun's wrapper kept as context;
    each stream is read on its own, as the runner reads them."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    r = two_ranks(script)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    causes = Causes()
    for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        for line in filter(None, (clean(x) for x in text.split("\n"))):
            causes.feed(line, stream)
    cause = causes.cause(r.returncode)
    assert re.fullmatch(
        r"rank 1 \(local_rank 1, host \S+\) was killed by SIGKILL; "
        r"ChildFailedError: rank 1 \(local_rank 1, host \S+\) failed first",
        cause,
    ), (cause, r.stderr[-3000:])

"""The runner's readers: trainer_log.jsonl followed incrementally, tqdm output cleaned."""

from __future__ import annotations

import pytest

from tunedeck.contract.output import clean
from tunedeck.runner.causes import failure_cause
from tunedeck.runner.tail import JsonlTail, LineSplitter


def test_jsonl_tail_reads_each_whole_line_once(tmp_path):
    path = tmp_path / "trainer_log.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # not there yet
    path.write_text('{"current_steps": 1}\n{"current_')
    assert tail.read() == ['{"current_steps": 1}']
    with path.open("a") as f:
        f.write('steps": 2}\n')
    assert tail.read() == ['{"current_steps": 2}']
    assert tail.read() == []
    assert tail.line == 2


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            "\x1b[A\r  5%|5         | 1/20 [00:01<00:19]\r 10%|#         | 2/20 [00:02<00:18]",
            " 10%|#         | 2/20 [00:02<00:18]",
        ),
        ("\x1b[32mINFO\x1b[0m loaded", "INFO loaded"),
        ("tab\tkept\x07", "tab\tkept"),
        ("\r\r", ""),
    ],
)
def test_clean(raw, shown):
    assert clean(raw) == shown


def test_splitter_keeps_partial_lines():
    s = LineSplitter()
    assert s.feed(b"first\nsec") == ["first"]
    assert s.feed(b"ond\r\x1b[2Kthird\n") == ["third"]
    assert s.feed(b"\xe4\xb8") == []
    assert s.feed(b"\xad done") == []
    assert s.flush() == ["\u4e2d done"]


def test_failure_cause():
    assert (
        failure_cause(["x", "ValueError: Undefined dataset foo in dataset_info.json.", "  "], 1)
        == "ValueError: Undefined dataset foo in dataset_info.json."
    )
    assert failure_cause(
        ["torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2 GiB", "Traceback"], 1
    ).startswith("out of memory")
    assert failure_cause([], -9) == "killed by SIGKILL"
    assert failure_cause(["bye"], 3) == "exited with code 3"

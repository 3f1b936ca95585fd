"""Why a trainer failed, read from its output: the first real exception, with its file and line.

A failed torchrun job ends with torchrun's own traceback (`ChildFailedError`) and a summary naming the
rank that failed first; the exception that made it fail is further up, in that rank's traceback
(each of its lines prefixed `[rankN]: ` once the process group is up, bare before). Python's chained
tracebacks ("During handling of the above exception...") end with the exception that propagated:
that is the one a traceback says it died of. Wrappers (torchrun's, a launcher's CalledProcessError)
are kept as context, never as the cause.

A log record (LLaMA-Factory's `[INFO|...]`, transformers', DeepSpeed's, torch's `W1202 ...]`) is never
the cause, and never part of a traceback: LLaMA-Factory logs to stdout and Python prints tracebacks to
stderr, the runner reads the two in separate threads, so its last "Loading dataset ..." line may arrive
in the middle of the traceback it precedes. Each traceback is read on its own stream and rank.

`Causes` reads the output a line at a time and keeps O(ranks) state, so the runner feeds it every line
of a long run and reports `cause(exit_code)` as the job's `error`.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from tunedeck.alerts.training import OOM  # one definition of an out-of-memory line

RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:(?: |$)")
TRACEBACK = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# An exception line outside a traceback (a logged error); inside one, any unindented line ends it.
EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b:?.*")
EXCEPTION_NAME = re.compile(r"^([\w.]+)(?::|$)")
# Exceptions that only say another process failed: context, never the cause.
WRAPPERS = frozenset({"ChildFailedError", "CalledProcessError", "SystemExit"})
ROOT_CAUSE = "Root Cause (first observed failure):"
ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
ROOT_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
# A log record, at any level: the logging formats of LLaMA-Factory and transformers (`[INFO|...`),
# DeepSpeed (`[2026-12-02 15:17:01,123] [WARNING] [...]`), torch's glog (`W1202 07:27:24.371000 24986
# torch/...:874] `) and Python's defaults (`WARNING:root:`, `2026-12-02 15:17:01,123 - INFO - ...`).
LEVEL = r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
LOG_RECORD = re.compile(
    rf"^\[{LEVEL}\|"
    rf"|^\[\d{{4}}-\d\d-\d\d [\d:.,]+\]\s*\[{LEVEL}\]"
    r"|^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]\s]+:\d+\]"
    rf"|^{LEVEL}:[\w.]*:"
    rf"|^\d{{4}}-\d\d-\d\d[ T][\d:.,]+\s+(?:-\s+)?(?:[\w.]+\s+-\s+)?{LEVEL}\b"
)
SEVERE = frozenset({"ERROR", "CRITICAL", "FATAL", "E", "F"})  # levels whose out-of-memory line counts
MAX_TEXT = 1000  # characters of an exception line kept (the cause is at most 2000: protocol.RunnerState)
SITE = re.compile(r"^.*/(?:site|dist)-packages/")


@dataclass
class Raised:
    """One exception a traceback ended with, where it was raised, and the rank that printed it."""

    text: str
    file: str | None
    line: int | None
    func: str | None
    rank: int | None

    @property
    def name(self) -> str:
        m = EXCEPTION_NAME.match(self.text)
        return m.group(1).rsplit(".", 1)[-1] if m else ""

    @property
    def wrapper(self) -> bool:
        return self.name in WRAPPERS

    def __str__(self) -> str:
        where = []
        if self.file is not None:
            where.append(f"at {SITE.sub('', self.file)}:{self.line}, in {self.func}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        return self.text[:MAX_TEXT] + (f" ({'; '.join(where)})" if where else "")


@dataclass
class _Stream:
    """What one rank's traceback reader is in the middle of."""

    mode: str = ""  # "" | "frames" (inside a traceback) | "after" (its exception read) | "chain"
    frame: tuple[str, int, str] | None = None
    chain: list[Raised] = field(default_factory=list)


@dataclass
class _Root:
    """torchrun's "Root Cause (first observed failure)" block."""

    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    host: str | None = None


class Causes:
    """Reads output lines (`feed`) and says what the run died of (`cause`)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str | None, int | None], _Stream] = {}  # by (stream, rank)
        self.first: Raised | None = None  # the first real exception any rank raised
        self.by_rank: dict[int, Raised] = {}  # each prefixed rank's first real exception
        self.wrapper: Raised | None = None
        self.oom: str | None = None
        self.bare: str | None = None  # the last exception line seen outside any traceback
        self.root: _Root | None = None
        self._in_root = False

    def feed(self, line: str, stream: str | None = None) -> None:
        """One line of the output; `stream` ("stdout", "stderr") where the reader knows it."""
        m = RANK_PREFIX.match(line)
        rank, text = (int(m.group(1)), line[m.end() :]) if m else (None, line)
        if record := LOG_RECORD.match(text.lstrip()):
            # Never the cause (an error record may still say the run ran out of memory), nor a line
            # of the traceback it may have landed inside.
            level = next(g for g in record.groups() if g)
            if self.oom is None and level in SEVERE and OOM.search(text):
                self.oom = text.strip()
            return
        s = self._streams.setdefault((stream, rank), _Stream())
        if self.oom is None and OOM.search(text):
            self.oom = text.strip()
        if text.strip() == TRACEBACK:
            if s.mode == "after":  # a new traceback, not chained: the one before has ended
                self._commit(s)
            s.mode, s.frame = "frames", None
            return
        if s.mode == "frames":
            if f := FRAME.match(text):
                s.frame = (f["file"], int(f["line"]), f["func"].strip())
            elif text.strip() and not text[0].isspace():  # the exception the traceback ends with
                file, lineno, func = s.frame or (None, None, None)
                s.chain.append(Raised(text.strip(), file, lineno, func, rank))
                s.mode = "after"
            return
        if s.mode in ("after", "chain"):
            if not text.strip():
                return
            if text.strip() in CHAINED:
                s.mode = "chain"
                return
            self._commit(s)
        self._summary(text)
        if EXCEPTION.match(text.strip()):
            self.bare = text.strip()

    def _commit(self, s: _Stream) -> None:
        """A chain of tracebacks has ended: the exception that propagated is its cause, unless it
        only wraps another (then the one it wraps, where the chain has it)."""
        chain, s.chain, s.mode = s.chain, [], ""
        if not chain:
            return
        last = chain[-1]
        real = next((r for r in reversed(chain) if not r.wrapper), None)
        if last.wrapper and self.wrapper is None:
            self.wrapper = last
        if real is not None:
            self.first = self.first or real
            if real.rank is not None:
                self.by_rank.setdefault(real.rank, real)

    def _summary(self, text: str) -> None:
        """torchrun's root-cause block: the rank that failed first, its host and exit code."""
        if text.startswith(ROOT_CAUSE):
            self._in_root, self.root = True, _Root()
            return
        if not self._in_root or self.root is None:
            return
        if text.startswith("===="):
            self._in_root = False
        elif m := ROOT_RANK.match(text):
            self.root.rank, self.root.local_rank = int(m[1]), int(m[2])
        elif m := ROOT_EXIT.match(text):
            self.root.exit_code = int(m[1])
        elif m := ROOT_HOST.match(text):
            self.root.host = m[1]

    def cause(self, exit_code: int) -> str:
        """One line for the job's `error`: the real exception with its place, the wrapper as context."""
        for s in self._streams.values():  # the output has ended: so has every traceback in it
            if s.mode in ("after", "chain"):
                self._commit(s)
        if self.oom is not None:
            oom = self.first if self.first and OOM.search(self.first.text) else None
            return f"out of memory: {oom or self.oom[:MAX_TEXT]}"
        if exit_code < 0:  # a signal ended it: any exception above is older news
            return f"killed by {_signal(exit_code)}"
        context = f"; {self.wrapper.name}" if self.wrapper else ""
        root = self.root
        if root is not None and root.rank is not None:
            who = f"rank {root.rank} (local_rank {root.local_rank}" + (
                f", host {root.host})" if root.host else ")"
            )
            context = f"; {self.wrapper.name if self.wrapper else 'torchrun'}: {who} failed first"
            if root.exit_code is not None and root.exit_code < 0:
                return f"{who} was killed by {_signal(root.exit_code)}{context}"
            raised = self.by_rank.get(root.rank) or self.first
            if raised is not None:
                return f"{raised}{context}"
            return f"{who} exited with code {root.exit_code}{context}"
        if self.first is not None:
            return f"{self.first}{context}"
        if self.wrapper is not None:
            return str(self.wrapper)
        if self.bare is not None:
            return self.bare[:MAX_TEXT]
        return f"exited with code {exit_code}"


def _signal(exit_code: int) -> str:
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def failure_cause(lines: list[str], exit_code: int) -> str:
    """The cause of a run whose whole output is `lines`."""
    causes = Causes()
    for line in lines:
        causes.feed(line)
    return causes.cause(exit_code)

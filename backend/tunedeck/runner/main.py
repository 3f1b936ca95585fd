"""One runner per job: `python -m tunedeck.runner RUN_DIR`.

Starts LLaMA-Factory's training (tunedeck_train/lf_train.py: `llamafactory-cli train` plus our
callbacks) in a session of its own (no shell), follows trainer_log.jsonl and the output, and reports
everything to the server in batches: a trainer_log line or a memory sample as soon as it exists
(runner/watch.py), output lines every `flush_s` (or sooner, with either). SIGTERM or SIGINT to the
runner means "cancel": SIGABRT to the trainer tree (LLaMA-Factory stops after the step and saves),
then SIGTERM, then SIGKILL, each after a grace period.

Once the trainer has ended, every batch is in the outbox on disk, and the server replays an outbox
when it finds its runner gone: the runner then waits for the server only while that is worth it.
It leaves at once on SIGTERM or SIGINT, or when no server answers and the server said it stopped
(runfiles.SERVER_STOPPED); after `unreachable_s` of no answer at all; and at the latest after
`give_up_s` (a server that answers but does not take the batches: a full disk).

In a multi-node job each node has a runner (`python -m tunedeck.runner RUN_DIR RANK`): rank 0 is the
one above; the others send their output and memory only, from files of their own.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from tunedeck import procs
from tunedeck.contract import runfiles
from tunedeck.contract.protocol import RunnerConfig, node_name
from tunedeck.contract.stacks import StackReport
from tunedeck.runner import stacks
from tunedeck.runner.causes import Causes
from tunedeck.runner.phases import Change, Phases, op_being_built
from tunedeck.runner.report import Reporter
from tunedeck.runner.tail import JsonlTail, LineSplitter
from tunedeck.runner.watch import FileWatch
from tunedeck.telemetry.sampler import Sampler

# LLaMA-Factory's train command with our callbacks (full checkpoint on stop, grad_norm); run by path.
# Found, not imported: the runner, like the server, never loads the training packages.
TRAIN_SCRIPT = procs.script("tunedeck_train.lf_train")
RANK_LINE_BASE = 1 << 40  # rank r numbers its log lines and memory samples from r << 40: never rank 0's
BUILD_CHECK_S = 1.0  # how often the trainer's tree is looked at for an op build (phases.op_being_built)


def _trainer_start(limit: int | None):
    """In the trainer's child before exec: RLIMIT_AS (CPU nodes: an allocation past it fails as
    out-of-memory), and SIGUSR1 ignored. Slurm's time-limit warning (`--signal`) reaches every process
    of the step, and its default action would end the trainer and its workers (an ignored signal stays
    ignored across exec): the runner alone takes it, and stops the trainer after the step."""

    def start() -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return start


def read_token() -> str:
    """The job's token, sent by the server on stdin once; stdin is then closed for good."""
    token = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if not token:
        sys.exit("tunedeck runner: no job token on stdin (the server writes it there)")
    return token


class Runner:
    def __init__(self, run_dir: Path, token: str, rank: int = 0):
        self.run_dir = run_dir
        self.cfg = RunnerConfig.read(run_dir, rank)
        self.rank = rank
        self.reporter = Reporter(
            url=self.cfg.server_url,
            job_id=self.cfg.job_id,
            token=token,
            run_dir=run_dir,
            retry_max_s=self.cfg.retry_max_s,
            merge_items=self.cfg.batch_max,
            say=self.note,
            node=node_name(self.cfg.node or platform.node()),
            outbox=self._file(runfiles.OUTBOX),
            send=self.cfg.transport == "http",
        )
        self.tail = JsonlTail(Path(self.cfg.output_dir) / runfiles.TRAINER_LOG)
        self.extra_tail = JsonlTail(Path(self.cfg.output_dir) / runfiles.EXTRA_LOG)
        self._extras: dict[int, str] = {}  # line i of the extra log: the numbers of trainer_log line i
        self.cancel = threading.Event()
        self.leave = threading.Event()  # a stop asked for after the trainer ended: no waiting for the server
        self.ended = False  # the trainer has ended: a signal means leave, not cancel
        self.wake = (
            threading.Event()
        )  # set by the trainer_log watch, the sampler, cancel and the trainer's exit
        self.watch: FileWatch | None = None
        self.cancelled = False
        self.time_limited = False  # warned that the allocation ends (SIGUSR1): stop, save, be resumed
        self._lines: deque[tuple[str, float, str]] = deque()  # (stream, t, text) from reader threads
        self._lock = threading.Lock()
        self._log_line = rank * RANK_LINE_BASE
        self._causes = Causes()  # what the trainer died of, read from all its output
        self._phases = Phases(self.cfg.command)  # what it is doing, from the same output
        self._trainer_pid: int | None = None
        self._build_checked = 0.0
        # The human log, raw bytes; open for the run.
        self._raw = open(run_dir / self._file(runfiles.TRAIN_LOG), "ab")
        self.sampler: Sampler | None = None  # memory of the job's own devices
        self.trainer_pid: int | None = None
        self._stacks_asked = 0  # the newest stack-dump request taken from the server's answers
        self.reporter.on_answer = self._answered
        if self.cfg.transport == "files":  # no answers come: the server's requests are in the run folder
            threading.Thread(target=self._follow_asks, name="asks", daemon=True).start()

    def _file(self, name: str) -> str:
        return runfiles.ranked(name, self.rank)

    # ---------------------------------------------------------------- output readers
    def _reader(self, stream: str, fd) -> None:
        splitter = LineSplitter()
        while True:
            data = os.read(fd.fileno(), 65536)
            if not data:
                break
            with self._lock:
                self._raw.write(data)
                for text in splitter.feed(data):
                    self._lines.append((stream, time.time(), text))
        with self._lock:
            for text in splitter.flush():
                self._lines.append((stream, time.time(), text))

    def note(self, text: str) -> None:
        """A line from the runner itself, shown with the job's logs."""
        with self._lock:
            self._lines.append(("runner", time.time(), text))

    def _collect(self, *, flush: bool = True) -> bool:
        """Send what is new: trainer_log lines and memory samples always, output lines with them or
        when `flush`. True when something was sent."""
        now = time.time()
        # The extra line is written before its trainer_log line: read first, it is there when that is.
        # Rank 0's trainer alone writes trainer_log.jsonl: the job's metrics come from rank 0 only.
        base = self.extra_tail.line
        extras = self.extra_tail.read() if self.rank == 0 else []
        self._extras.update((base + i, raw) for i, raw in enumerate(extras))
        first = self.tail.line
        lines = self.tail.read() if self.rank == 0 else []
        metrics: list[dict[str, Any]] = [
            {"line": first + i, "t": now, "raw": raw} for i, raw in enumerate(lines)
        ]
        for m in metrics:
            if (extra := self._extras.pop(m["line"], None)) is not None:
                m["extra"] = extra[:65536]
        memory = self._sampler_drain()
        if not (metrics or memory or flush):
            return False
        logs: list[dict[str, Any]] = []
        changes: list[Change] = []
        with self._lock:
            while self._lines:
                stream, t, text = self._lines.popleft()
                change = None
                if stream != "runner":
                    self._causes.feed(text, stream)
                    change = self._phases.line(text, t)
                self._log(logs, stream, t, text)
                if change is not None:  # the log says when each phase began, after the line that began it
                    changes.append(change)
                    self._log(logs, "runner", t, str(change))
        for c in [*(self._phases.point(m["raw"], m["t"]) for m in metrics), self._build_check(now)]:
            if c is not None:
                changes.append(c)
                self._log(logs, "runner", c.t, str(c))
        # Rank 0's runner reports the job's phase (every local rank's output comes through it); the
        # server keeps the newest, so one state a batch says it.
        states = (
            [{"event": "phase", "phase": changes[-1].phase, "t": changes[-1].t}]
            if changes and not self.rank
            else []
        )
        sent = bool(metrics or logs or memory)
        limit = self.cfg.batch_max
        while metrics or logs or memory:
            take_m = metrics[:limit]
            take_l = logs[: max(0, limit - len(take_m))]
            take_s = memory[: max(0, limit - len(take_m) - len(take_l))]
            metrics, logs, memory = metrics[len(take_m) :], logs[len(take_l) :], memory[len(take_s) :]
            last_part = not (metrics or logs or memory)
            self.reporter.add(metrics=take_m, logs=take_l, memory=take_s, states=states if last_part else ())
        return sent

    def _log(self, logs: list[dict[str, Any]], stream: str, t: float, text: str) -> None:
        if self.rank:
            text = f"[rank {self.rank}] {text}"
        logs.append({"line": self._log_line, "t": t, "stream": stream, "text": text[:65536]})
        self._log_line += 1

    def _build_check(self, now: float) -> Change | None:
        """An op build under the trainer, looked for at most every BUILD_CHECK_S: DeepSpeed builds
        its ops without a line (runner/phases.py)."""
        pid = self._trainer_pid
        if pid is None or self.ended or time.monotonic() - self._build_checked < BUILD_CHECK_S:
            return None
        self._build_checked = time.monotonic()
        return self._phases.building(op_being_built(pid), now)

    # ---------------------------------------------------------------- stopping
    def _stop_sequence(self, trainer: subprocess.Popen) -> None:
        key = self.cfg.job_key
        me = {os.getpid()}
        self.cancelled = True
        targets = procs.training_processes(trainer.pid)
        if self.cfg.command == "train" and self.cfg.rank > 0:
            # The ranks agree on a stop at each step's end (lf_train's SaveOnStop: an all-reduce of
            # the flag), so rank 0's SIGABRT stops this node too, after the same step. A signal of
            # its own, coming a poll later, could reach a worker that has left training (its final
            # evaluation or save) and kill it there, leaving rank 0 stuck in a collective.
            self.note(
                "cancel requested: rank 0 stops every rank after this step; waiting for this node's trainer"
            )
        elif self.cfg.command == "train":
            self.note(
                f"cancel requested: SIGABRT to {len(targets)} training process(es), graceful stop after this step"
            )
            procs.signal_all(targets, signal.SIGABRT)
        else:  # export and api have no SIGABRT handler (it would dump core); uvicorn stops on SIGTERM
            self.note(f"cancel requested: SIGTERM to {len(targets)} process(es)")
            procs.signal_all(targets, signal.SIGTERM)
        for sig, grace in ((signal.SIGTERM, self.cfg.abort_grace_s), (signal.SIGKILL, self.cfg.term_grace_s)):
            try:
                trainer.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
            self.note(f"trainer still running after {grace:g}s: {signal.Signals(sig).name}")
            procs.signal_all(procs.tree(trainer.pid, key, exclude=me), sig)

    # ---------------------------------------------------------------- main
    def run(self) -> int:
        cli = Path(self.cfg.train_python).parent / "llamafactory-cli"
        env = {**procs.trainer_env(dict(os.environ)), **self.cfg.env}
        env["PATH"] = f"{cli.parent}{os.pathsep}{env.get('PATH', '')}"  # torchrun must be found
        env[procs.JOB_KEY_ENV] = self.cfg.job_key
        # LLaMA-Factory installs its graceful SIGABRT handler only in web-UI mode.
        env["LLAMABOARD_ENABLED"] = "1"
        env["LLAMABOARD_WORKDIR"] = self.cfg.output_dir
        env["PYTHONUNBUFFERED"] = "1"
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGABRT before training starts dumps core
        try:
            trainer = subprocess.Popen(
                # train (eval and predict too) goes through our script for its callbacks; the rest through the CLI
                [self.cfg.train_python, str(TRAIN_SCRIPT), runfiles.TRAIN_YAML]
                if self.cfg.command == "train"
                else [str(cli), self.cfg.command, runfiles.TRAIN_YAML],
                cwd=self.run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_trainer_start(self.cfg.rlimit_as_bytes),
            )
        except OSError as e:
            return self._finish(exit_code=127, cause=f"cannot start llamafactory-cli: {e}")
        self.trainer_pid = trainer.pid
        (self.run_dir / self._file(runfiles.TRAINER_PID)).write_text(str(trainer.pid))
        self._trainer_pid = trainer.pid
        watch = self.watch = self._start_watch()  # after the fork (preexec_fn): no new thread while it runs
        self.sampler = self._start_sampler(trainer.pid)
        if self.rank == 0:  # the job's trainer pid and its end are rank 0's to tell
            self.reporter.add(states=[{"event": "started", "trainer_pid": trainer.pid}])
        readers = [
            threading.Thread(target=self._reader, args=(name, fd), daemon=True)
            for name, fd in (("stdout", trainer.stdout), ("stderr", trainer.stderr))
        ]
        for r in readers:
            r.start()
        self._follow(trainer, watch)
        for r in readers:
            r.join(timeout=10)
        # No process of the job may outlive it (torchrun workers, dataloader workers, ...).
        left = procs.kill_job(self.cfg.job_key, exclude={os.getpid()})
        if left:
            self.note(f"killed {left} leftover process(es) of the job")
        code = trainer.returncode
        cause = None if code == 0 and not self.cancelled else self._causes.cause(code)
        if self.cancelled and self.cfg.command == "api" and code in (0, -signal.SIGTERM):
            cause = "chat server stopped (cancelled, or idle for TUNEDECK_CHAT_IDLE_S)"
        return self._finish(exit_code=code, cause=cause)

    # ---------------------------------------------------------------- stack dumps
    def _answered(self, answer: dict) -> None:
        """The server's answer to a batch: a newer stack-dump request is taken once, off the sender."""
        asked = answer.get("stacks")
        if isinstance(asked, int) and asked > self._stacks_asked:
            self._stacks_asked = asked
            threading.Thread(target=self._dump_stacks, args=(asked,), name="stacks", daemon=True).start()

    def _follow_asks(self, every_s: float = 1.0) -> None:
        """The files transport: the server writes its newest stack-dump request to the run folder."""
        path = self.run_dir / runfiles.STACKS_ASKED
        while True:
            try:
                self._answered({"stacks": int(path.read_text().strip())})
            except (OSError, ValueError):
                pass  # none asked yet (or a write in progress: the next look reads it)
            time.sleep(every_s)

    def _send_stacks(self, found: StackReport) -> str:
        """The report to the server: posted, or (files transport) left in the run folder for it."""
        if self.cfg.transport == "http":
            return str(self.reporter.post("stacks", found.model_dump()))
        path = self.run_dir / self._file(runfiles.STACKS_REPORT)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(found.model_dump_json())
        os.replace(tmp, path)
        return "left in the run folder"

    def _dump_stacks(self, request: int) -> None:
        found = stacks.collect(
            self.trainer_pid,
            request=request,
            node=self.reporter.node,
            runner_rank=self.rank,
            folder=self.run_dir,
        )
        status = self._send_stacks(found)
        dumped = sum(1 for p in found.processes if not p.error)
        if found.error:
            self.note(f"stack dump {request}: {found.error}")
        else:
            self.note(
                f"stack dump {request}: {dumped} of {len(found.processes)} process(es) dumped, sent ({status})"
            )

    def _start_watch(self) -> FileWatch:
        out = Path(self.cfg.output_dir)
        try:  # made now so it can be watched; LLaMA-Factory runs with overwrite_output_dir
            out.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # the watch falls back to polling and says why
        watch = FileWatch(out, runfiles.TRAINER_LOG, self.wake, mode=self.cfg.watch)
        self.note(watch.describe(self.cfg.poll_s))
        self.wake.set()  # lines written before the watch began are read at once, later ones wake it
        return watch

    def _follow(self, trainer: subprocess.Popen, watch: FileWatch) -> None:
        """Until the trainer exits: wake on a trainer_log write, a memory sample or cancel (or each
        `poll_s` when polling) and send what is new; output lines alone wait up to `flush_s`."""
        stopper = None

        def exited() -> None:
            trainer.wait()
            self.wake.set()

        threading.Thread(target=exited, name="trainer-exit", daemon=True).start()
        flush_s = self.cfg.flush_s
        next_flush = time.monotonic() + flush_s
        while trainer.poll() is None:
            if self.cancel.is_set() and stopper is None:
                stopper = threading.Thread(target=self._stop_sequence, args=(trainer,), daemon=True)
                stopper.start()
            wait = self.cfg.poll_s if watch.mode == "poll" else flush_s
            self.wake.wait(max(0.0, min(wait, next_flush - time.monotonic())))
            self.wake.clear()  # before reading: a write after this point wakes the next wait
            due = time.monotonic() >= next_flush
            if self._collect(flush=due) or due:
                next_flush = time.monotonic() + flush_s

    def _sampler_drain(self) -> list[dict]:
        s = self.sampler
        if s is None:
            return []
        if s.ready.is_set() and not getattr(self, "_sampler_noted", False):
            self._sampler_noted = True
            what = (
                f"{s.backend_name} GPUs {s.indices}" if s.backend_name != "cpu" else "host memory of the job"
            )
            self.note(
                f"memory sampler: {what}, every {s.interval_s:g}s (max of {s.polls} polls)"
                + (f"; no GPU telemetry: {s.reason}" if s.gpus and s.backend_name == "cpu" else "")
            )
        samples = s.drain()
        if self.rank:
            for m in samples:
                m["line"] += self.rank * RANK_LINE_BASE
        return samples

    def _start_sampler(self, trainer_pid: int) -> Sampler | None:
        env = self.cfg.env
        visible = [
            int(d)
            for d in (env.get("HIP_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES") or "").split(",")
            if d.strip().isdigit()
        ]
        try:
            return Sampler(
                interval_s=self.cfg.memory_sample_s,
                polls=self.cfg.memory_polls,
                gpus=bool(visible),
                visible=visible,
                bus_ids=self.cfg.bus_ids,
                root_pid=trainer_pid,
                on_sample=self.wake.set,
            ).start()
        except Exception as e:
            self.note(f"memory sampler not started: {e}")
            return None

    def time_limit_ahead(self) -> None:
        """SIGUSR1 (Slurm's `--signal` before the time limit): stop as a cancel does, after the step with a
        checkpoint, and say so in the exit, so the server resumes the run from it."""
        if not self.ended:
            self.time_limited = True
        self.stop_requested()

    def stop_requested(self) -> None:
        """SIGTERM or SIGINT: cancel the training, or, once it has ended, leave."""
        if self.ended:
            self.leave.set()
        self.cancel.set()
        self.wake.set()

    def _leaving(self) -> str | None:
        """Why a runner whose trainer has ended stops waiting for the server (None: it waits on)."""
        if self.leave.is_set():
            return "asked to stop"
        away = self.reporter.unreachable_for()
        if away is None:
            return None  # a server answers
        if (self.run_dir / runfiles.SERVER_STOPPED).exists():
            return "the server was stopped"
        if away >= self.cfg.unreachable_s:
            return f"no server answered for {away:.0f}s"
        return None

    def _finish(self, *, exit_code: int, cause: str | None) -> int:
        self.ended = True
        if self.cancel.is_set() and not self.cancelled:  # a signal that came as the trainer ended
            self.leave.set()
        if self.sampler is not None:
            self.sampler.stop()
        if self.watch is not None:
            self.watch.close()
        self._collect()
        state = {
            "event": "exited",
            "exit_code": exit_code,
            "cancelled": self.cancelled,
            "time_limit": self.time_limited and self.cancelled,
            "cause": cause,
        }
        # result.json first: a server that never hears from us reads it from the run folder.
        (self.run_dir / self._file(runfiles.RESULT)).write_text(json.dumps(state))
        if self.rank == 0:
            self.reporter.add(states=[state])
        self.tail.close()
        self.extra_tail.close()
        self._raw.close()
        if not self.reporter.drain(self.cfg.give_up_s, leave=self._leaving):
            why = self._leaving() or f"still undelivered after {self.cfg.give_up_s:g}s"
            print(
                f"[tunedeck runner] {why}: {self.reporter.pending} batch(es) left in the outbox "
                "(the server replays it)",
                file=sys.stderr,
            )
        self.reporter.close()
        return 0


def watch_parent(job_key: str, parent: int, stop: threading.Event, every_s: float = 1.0) -> None:
    """A runner started by a Ray actor dies with it: a node whose raylet was killed must not keep
    training (the runner leads a session of its own, so nothing else would stop it)."""
    while not stop.wait(every_s):
        if os.getppid() != parent:
            print(
                "[tunedeck runner] the actor that started this runner is gone: ending the job here",
                file=sys.stderr,
            )
            procs.kill_job(job_key, exclude={os.getpid()})
            os._exit(70)


def cli() -> None:
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and not sys.argv[2].isdigit()):
        sys.exit("usage: python -m tunedeck.runner RUN_DIR [RANK]")
    parent = os.getppid()  # before anything: the actor may go while the runner starts
    os.umask(0o077)  # outbox, logs and the trainer's output stay private, whoever started the runner
    rank = int(sys.argv[2]) if len(sys.argv) == 3 else 0
    runner = Runner(Path(sys.argv[1]).resolve(), read_token(), rank)
    if runner.cfg.watch_parent:
        threading.Thread(
            target=watch_parent,
            args=(runner.cfg.job_key, parent, threading.Event()),
            name="parent",
            daemon=True,
        ).start()

    def on_signal(signum, _frame) -> None:
        runner.stop_requested()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: runner.time_limit_ahead())
    sys.exit(runner.run())

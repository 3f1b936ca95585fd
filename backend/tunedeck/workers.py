"""The server's background threads share one shape: a loop that runs `run_once`, then sleeps.

A pass runs every `interval_s`, or at once after `wake()`; an exception in a pass is logged and the
next pass still comes, so one bad row never stops the scheduler or the ingest writer. The lifespan
(main.py) holds the list of workers, starts them in order and stops them in reverse.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import psutil

log = logging.getLogger("tunedeck.workers")


def lower_this_thread() -> None:
    """The calling thread at the lowest CPU priority (nice 19) and in the idle I/O class, where the
    system allows it: for work that reads a whole database file beside serving (its full check, the
    page survey). On a store larger than the machine's memory such a read took a core and the disk
    for minutes, and ingest fell behind (bench/cluster_shape.md, 72 h of history). Linux sets both
    per thread; the server's other threads keep theirs."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    with contextlib.suppress(psutil.Error, OSError, AttributeError, ValueError):
        psutil.Process(tid).ionice(psutil.IOPRIO_CLASS_IDLE)


class Worker:
    name = "worker"
    interval_s = 1.0
    delay_s = 0.0  # before the first pass: work that must not compete with start-up
    final_pass = False  # one more pass after stop(): queues are drained, not dropped
    stop_timeout_s = 10.0
    background = False  # its thread runs at the lowest priorities (lower_this_thread)

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to end (after its final pass) without waiting for it."""
        self._stop.set()
        self._wake.set()

    def stop(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_timeout_s)

    def wake(self) -> None:
        """Run the next pass now (any thread)."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _pass(self) -> None:
        try:
            self.run_once()
        except Exception:  # the thread must outlive a bad pass
            log.exception("%s: pass failed", self.name)

    def _sleep(self, seconds: float) -> None:
        # Cleared after the wait: whoever queues work before calling wake() is seen by the next pass.
        self._wake.wait(seconds)
        self._wake.clear()

    def _loop(self) -> None:
        if self.background:
            lower_this_thread()
        if self.delay_s:
            self._sleep(self.delay_s)
        while not self._stop.is_set():
            self._pass()
            self._sleep(self.interval_s)
        if self.final_pass:
            self._pass()

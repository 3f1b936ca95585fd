"""How a runner notices new trainer_log.jsonl lines: inotify on the file's folder, or polling.

With inotify the kernel wakes the runner as the trainer writes, so a line is on its way to the
server within milliseconds. Polling (every `runner_poll_s`) is the fallback: forced with
`runner_watch = poll` (a network file system whose writes come from another host never raises
inotify events here), or taken when inotify cannot be had (not Linux, the per-user limits on
instances or watches reached, the folder missing).
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path
from typing import Any

COALESCE_S = 0.005  # lines written together (an eval line right after a train line) go in one batch


class FileWatch:
    """Sets `wake` each time `name` in `folder` is written to. `mode` is "inotify" while the kernel
    reports changes and "poll" when the caller must look by itself; `reason` says why it polls."""

    def __init__(self, folder: Path, name: str, wake: threading.Event, *, mode: str = "auto"):
        self.folder, self.name, self.wake = folder, name, wake
        self.mode = "poll"
        self.reason: str | None = "polling was asked for (runner_watch = poll)"
        self._ino: Any = None  # an inotify_simple.INotify (the package has no types)
        self._stop_r, self._stop_w = -1, -1
        if mode == "poll":
            return
        try:
            self._ino = _watch(folder)
        except (ImportError, OSError) as e:
            self.reason = f"inotify unavailable: {e}"
            return
        self._stop_r, self._stop_w = os.pipe()
        self.mode, self.reason = "inotify", None
        self._thread = threading.Thread(target=self._loop, name="trainer-log-watch", daemon=True)
        self._thread.start()

    def describe(self, poll_s: float) -> str:
        if self.mode == "inotify":
            return f"following {self.name} with inotify (each line is sent as it is written)"
        return f"following {self.name} by polling every {poll_s:g}s ({self.reason})"

    def close(self) -> None:
        if self._ino is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self._ino.close()
        self._ino = None

    def _loop(self) -> None:
        from inotify_simple import flags

        gone = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF
        poller = select.poll()
        poller.register(self._ino.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            time.sleep(COALESCE_S)  # let a burst of writes land, so it goes as one batch
            events = list(self._ino.read(timeout=0))
            if any(e.mask & gone for e in events):
                # The folder itself went away: nothing more will be reported, so the caller polls.
                self.mode, self.reason = "poll", f"{self.folder} was removed or moved"
                self.wake.set()
                return
            if any(e.name == self.name or e.mask & flags.Q_OVERFLOW for e in events):
                self.wake.set()


def _watch(folder: Path):
    from inotify_simple import INotify, flags

    ino = INotify()
    try:
        ino.add_watch(
            folder, flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF
        )
    except OSError:
        ino.close()
        raise
    return ino

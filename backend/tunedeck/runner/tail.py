"""Incremental readers: trainer_log.jsonl lines and cleaned stdout/stderr lines (contract/output.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from tunedeck.contract.output import clean


class JsonlTail:
    """Yields each whole line appended to a file once; never re-reads what it has read."""

    def __init__(self, path: Path):
        self.path = path
        self.line = 0  # number of whole lines handed out
        self._fh: BinaryIO | None = None
        self._inode: int | None = None
        self._partial = b""

    def read(self) -> list[str]:
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")  # kept open between reads
            except FileNotFoundError:
                return []
            self._inode = os.fstat(self._fh.fileno()).st_ino
        data = self._fh.read()
        if not data:
            return []
        data = self._partial + data
        *whole, self._partial = data.split(b"\n")
        lines = [w.decode("utf-8", "replace") for w in whole if w.strip()]
        self.line += len(lines)
        return lines

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class LineSplitter:
    """Bytes in, cleaned lines out; tqdm's \\r updates collapse into the line they end on."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        *whole, self._buf = self._buf.split(b"\n")
        return [c for c in (clean(w.decode("utf-8", "replace")) for w in whole) if c]

    def flush(self) -> list[str]:
        rest, self._buf = self._buf, b""
        c = clean(rest.decode("utf-8", "replace"))
        return [c] if c else []

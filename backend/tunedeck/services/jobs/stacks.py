"""Stack-dump requests and the dumps each node's runner sends back, kept with the job.

A request (a `stall` alert opening, or the owner asking) gets the job's next number; runners read the
newest number from the answers to their telemetry batches and post one report per node. Requests and
reports are files under `<workspace>/stacks/<job id>/`: `requests.jsonl` (one line per request, its
number, time and reason) and `<request>/<node>.rank<r>.json`, so a restarted server still serves
them and still asks for the newest one. The newest number per job is also held in memory: the
telemetry route reads it for every batch.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from tunedeck.contract.stacks import StackReport, flight_summary, ranks_places, summary

KEEP_REQUESTS = 20  # a job's older dumps beyond this are removed when a new one is asked for


class StackStore:
    def __init__(self, root: Path):
        self.root = root
        self._asked: dict[int, int | None] = {}
        self._lock = threading.Lock()

    def _dir(self, job_id: int) -> Path:
        return self.root / str(int(job_id))

    def _requests(self, job_id: int) -> list[dict[str, Any]]:
        path = self._dir(job_id) / "requests.jsonl"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash mid-write
        return out

    def asked(self, job_id: int) -> int | None:
        """The newest request's number for the job, or None: what a runner is told with each answer."""
        with self._lock:
            if job_id not in self._asked:
                found = self._requests(job_id)
                self._asked[job_id] = found[-1]["request"] if found else None
            return self._asked[job_id]

    def request(self, job_id: int, reason: str) -> int:
        """Ask the job's runners for a dump now: the request's number."""
        with self._lock:
            found = self._requests(job_id)
            number = (found[-1]["request"] if found else 0) + 1
            folder = self._dir(job_id)
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "requests.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"request": number, "at": time.time(), "reason": reason}) + "\n")
            self._asked[job_id] = number
        for old in range(1, number - KEEP_REQUESTS + 1):
            for path in (folder / str(old)).glob("*.json"):
                path.unlink(missing_ok=True)
        return number

    def save(self, job_id: int, report: StackReport) -> None:
        """A node's report, kept once per request, node and rank (a resend replaces it)."""
        folder = self._dir(job_id) / str(report.request)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{report.node or 'local'}.rank{report.runner_rank}.json"
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(report.model_dump_json())
        os.replace(tmp, folder / name)

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._asked.pop(job_id, None)

    def dumps(self, job_id: int, request: int | None = None) -> dict[str, Any] | None:
        """A request (default the newest) with the reports that came for it and where each rank waits."""
        found = self._requests(job_id)
        if request is not None:
            found = [r for r in found if r["request"] == request]
        if not found:
            return None
        asked = found[-1]
        reports = []
        for path in sorted((self._dir(job_id) / str(asked["request"])).glob("*.json")):
            try:
                reports.append(StackReport.model_validate_json(path.read_text()))
            except (OSError, ValueError):
                continue
        return {
            "request": asked["request"],
            "asked_at": asked["at"],
            "reason": asked["reason"],
            "nodes": [
                {
                    "node": r.node,
                    "runner_rank": r.runner_rank,
                    "error": r.error,
                    "processes": r.model_dump()["processes"],
                }
                for r in reports
            ],
            "ranks": ranks_places(reports),
            "summary": summary(reports) if reports else None,
            "flight_recorder": flight_summary(reports),
        }

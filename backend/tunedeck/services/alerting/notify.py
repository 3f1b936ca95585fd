"""Webhooks: a JSON POST with a Slack-compatible `text` on new alerts and on job ends.

Callers only enqueue; each URL has its own lane (a queue and a thread) that posts, retrying with
backoff. A webhook that is down or hangs never slows training telemetry, nor the other webhooks.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck.alerts import at_least
from tunedeck.alerts.series import device
from tunedeck.config import Settings
from tunedeck.store.tables import Alert, Job

if TYPE_CHECKING:  # imported on the first webhook: most servers never post one, and start faster
    import httpx
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.notify")
ICON = {"info": "ℹ️", "warning": "⚠️", "critical": "🚨"}


class Lane(Worker):
    """One webhook URL: its own queue and thread, so a hanging endpoint delays only its own messages."""

    final_pass = True  # what was queued before stop is still sent
    stop_timeout_s = 5.0

    def __init__(self, url: str, retries: int, name_job) -> None:
        super().__init__()
        self.url, self.retries, self._name_job = url, retries, name_job
        self.name = f"webhook {url.split('?')[0]}"
        self.sent = 0
        self._q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=10000)

    def put(self, payload: dict[str, Any]) -> None:
        try:
            self._q.put_nowait(payload)
        except queue.Full:  # a dead webhook must not grow memory without end
            log.warning("webhook queue full for %s; dropping %s", self.name, payload.get("event"))
            return
        self.wake()

    def _post(self, client: httpx.Client, payload: dict[str, Any]) -> None:
        import httpx  # already loaded by run_once

        if payload["event"] == "job_finished":  # named here: JobState tells of an end only after its commit
            payload = dict(payload)
            payload["text"] = f"tunedeck: {self._name_job(payload['job_id'])} {payload['status']}" + (
                f": {payload['error']}" if payload.get("error") else ""
            )
        for attempt in range(self.retries + 1):
            try:
                r = client.post(self.url, json=payload)
                if r.status_code < 500 and r.status_code != 429:
                    self.sent += 1
                    return
            except httpx.HTTPError:
                pass
            if self.stopping and attempt:  # at shutdown one retry, not a backoff of minutes
                break
            time.sleep(min(0.5 * 2**attempt, 30))
        log.warning("webhook %s failed after %s tries", self.name, attempt + 1)

    def run_once(self) -> None:
        if self._q.empty():
            return
        import httpx

        with httpx.Client(timeout=10) as client:
            while True:
                try:
                    payload = self._q.get_nowait()
                except queue.Empty:
                    return
                try:
                    self._post(client, payload)
                except Exception:
                    log.exception("webhook failed")


class Notifier(Worker):
    """Fans what callers queue out to one lane per URL; `put` never waits on the network."""

    name = "webhooks"
    interval_s = 3600.0  # the lanes do the work; this thread only owns their lifetime

    def __init__(self, settings: Settings, engine: Engine | None = None):
        super().__init__()
        self.engine = engine
        self.min_severity = settings.webhook_min_severity
        self.lanes = [Lane(url, settings.webhook_retries, self._job_name) for url in settings.webhook_urls]

    @property
    def sent(self) -> int:
        return sum(lane.sent for lane in self.lanes)

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        for lane in self.lanes:
            lane.request_stop()
        for lane in self.lanes:  # stopped together: a hanging URL costs one timeout, not one per URL
            lane.stop()

    def run_once(self) -> None:
        return None

    def put(self, payload: dict[str, Any]) -> None:
        for lane in self.lanes:
            lane.put(payload)

    def job_finished(self, job_id: int, *, status: str, error: str | None) -> None:
        self.put({"event": "job_finished", "job_id": job_id, "status": status, "error": error})

    def alerts_opened(self, job: Job, alerts: list[Alert]) -> None:
        """The alert engine's hook: one message per new alert of the chosen severity or worse."""
        for a in alerts:
            if not at_least(a.severity, self.min_severity):
                continue
            where = "" if a.gpu is None else f" on {device(a.gpu)}"
            if a.gpu is not None and a.node and a.message.startswith(f"{a.node} "):  # named: several nodes
                where = f" on {a.node} {device(a.gpu)}"
            text = (
                f"{ICON.get(a.severity, '')} tunedeck {a.severity}: job {job.id} ({job.name}) {a.kind}"
                f"{where}: {a.message}" + (f"\nSuggestion: {a.suggestion}" if a.suggestion else "")
            )
            self.put(
                {
                    "event": "alert",
                    "text": text,
                    "job_id": job.id,
                    "alert_id": a.id,
                    "kind": a.kind,
                    "severity": a.severity,
                    "node": a.node or None,
                    "gpu": a.gpu,
                    "message": a.message,
                    "suggestion": a.suggestion,
                }
            )

    def _job_name(self, job_id: int) -> str:
        if self.engine is None:
            return f"job {job_id}"
        with Session(self.engine) as s:
            job = s.get(Job, job_id)
            return f"job {job_id} ({job.name})" if job else f"job {job_id}"

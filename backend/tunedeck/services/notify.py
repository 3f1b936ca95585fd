"""Webhooks: a JSON POST with a Slack-compatible `text` on new alerts and on job ends.

Callers only enqueue; one background thread posts, retrying with backoff. A webhook that is down
never slows training telemetry.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck.alerts import at_least
from tunedeck.config import Settings
from tunedeck.tables import Alert, Job

if TYPE_CHECKING:  # imported on the first webhook: most servers never post one, and start faster
    import httpx
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.notify")
ICON = {"info": "ℹ️", "warning": "⚠️", "critical": "🚨"}


class Notifier(Worker):
    """Posts what callers queue; `put` never waits on the network. One per server, in app.state."""

    name = "webhooks"
    final_pass = True  # what was queued before stop is still sent
    stop_timeout_s = 5.0

    def __init__(self, settings: Settings, engine: Engine | None = None):
        super().__init__()
        self.urls, self.retries, self.engine = list(settings.webhook_urls), settings.webhook_retries, engine
        self.min_severity = settings.webhook_min_severity
        self.sent = 0
        self._q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=10000)

    def put(self, payload: dict[str, Any]) -> None:
        if not self.urls:
            return
        try:
            self._q.put_nowait(payload)
        except queue.Full:  # a dead webhook must not grow memory without end
            log.warning("webhook queue full; dropping %s", payload.get("event"))
            return
        self.wake()

    def job_finished(self, job_id: int, *, status: str, error: str | None) -> None:
        self.put({"event": "job_finished", "job_id": job_id, "status": status, "error": error})

    def alerts_opened(self, job: Job, alerts: list[Alert]) -> None:
        """The alert engine's hook: one message per new alert of the chosen severity or worse."""
        for a in alerts:
            if not at_least(a.severity, self.min_severity):
                continue
            text = (
                f"{ICON.get(a.severity, '')} tunedeck {a.severity}: job {job.id} ({job.name}) {a.kind}"
                f"{'' if a.gpu is None else f' on GPU {a.gpu}'}: {a.message}"
                + (f"\nSuggestion: {a.suggestion}" if a.suggestion else "")
            )
            self.put(
                {
                    "event": "alert",
                    "text": text,
                    "job_id": job.id,
                    "alert_id": a.id,
                    "kind": a.kind,
                    "severity": a.severity,
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

    def _post(self, client: httpx.Client, payload: dict[str, Any]) -> None:
        import httpx  # already loaded by run_once

        if payload["event"] == "job_finished":  # named here: JobState tells of an end only after its commit
            payload["text"] = f"tunedeck: {self._job_name(payload['job_id'])} {payload['status']}" + (
                f": {payload['error']}" if payload.get("error") else ""
            )
        for url in self.urls:
            for attempt in range(self.retries + 1):
                try:
                    r = client.post(url, json=payload)
                    if r.status_code < 500 and r.status_code != 429:
                        self.sent += 1
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(min(0.5 * 2**attempt, 30))
            else:
                log.warning("webhook %s failed after %s tries", url, self.retries + 1)

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

"""Webhooks: a JSON POST with a Slack-compatible `text` on new alerts and on job ends.

Callers only enqueue (ingest calls this inside its transaction); one background thread posts,
retrying with backoff. A webhook that is down never slows training telemetry.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import httpx
from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck.config import Settings
from tunedeck.models import Alert, Job

log = logging.getLogger("tunedeck.notify")
ICON = {"info": "ℹ️", "warning": "⚠️", "critical": "🚨"}


class Notifier:
    def __init__(self, settings: Settings, engine: Engine | None = None):
        self.urls, self.retries, self.engine = list(settings.webhook_urls), settings.webhook_retries, engine
        self.min_severity = settings.webhook_min_severity
        self.sent = 0
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=10000)
        self._thread = threading.Thread(target=self._loop, name="webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)

    def put(self, payload: dict[str, Any]) -> None:
        if not self.urls:
            return
        try:
            self._q.put_nowait(payload)
        except queue.Full:  # a dead webhook must not grow memory without end
            log.warning("webhook queue full; dropping %s", payload.get("event"))

    def _job_name(self, job_id: int) -> str:
        if self.engine is None:
            return f"job {job_id}"
        with Session(self.engine) as s:
            job = s.get(Job, job_id)
            return f"job {job_id} ({job.name})" if job else f"job {job_id}"

    def _post(self, client: httpx.Client, payload: dict[str, Any]) -> None:
        if payload["event"] == "job_finished":  # named here: the finishing transaction has committed by now
            payload["text"] = f"tunedeck: {self._job_name(payload['job_id'])} {payload['status']}" + (
                f": {payload['error']}" if payload.get("error") else "")
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

    def _loop(self) -> None:
        with httpx.Client(timeout=10) as client:
            while (payload := self._q.get()) is not None:
                try:
                    self._post(client, payload)
                except Exception:
                    log.exception("webhook failed")


_current: Notifier | None = None


def start(settings: Settings, engine: Engine | None = None) -> Notifier:
    global _current
    _current = Notifier(settings, engine)
    _current.start()
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
    _current = None


def job_finished(job_id: int, *, status: str, error: str | None) -> None:
    if _current is not None:
        _current.put({"event": "job_finished", "job_id": job_id, "status": status, "error": error})


def alerts_opened(job: Job, alerts: list[Alert]) -> None:
    """The alert engine's hook: one message per new alert of the chosen severity or worse."""
    from tunedeck.services.alerts import at_least

    n = _current
    if n is None:
        return
    for a in alerts:
        if not at_least(a.severity, n.min_severity):
            continue
        text = (f"{ICON.get(a.severity, '')} tunedeck {a.severity}: job {job.id} ({job.name}) {a.kind}"
                f"{'' if a.gpu is None else f' on GPU {a.gpu}'}: {a.message}"
                + (f"\nSuggestion: {a.suggestion}" if a.suggestion else ""))
        n.put({"event": "alert", "text": text, "job_id": job.id, "alert_id": a.id, "kind": a.kind,
               "severity": a.severity, "gpu": a.gpu, "message": a.message, "suggestion": a.suggestion})

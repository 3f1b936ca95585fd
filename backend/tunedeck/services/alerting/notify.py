"""Webhooks: a JSON POST with a Slack-compatible `text` on new alerts and on job ends.

Callers only enqueue; each URL has its own lane (a queue and a thread) that posts, retrying with
backoff. A webhook that is down or hangs never slows training telemetry, nor the other webhooks.

A webhook URL is a credential (Slack's secret is its path): logs, thread names and error messages show
only its scheme and host, and httpx's own request log line is rewritten to match.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

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
HIDDEN = "/…"


def origin(url: str) -> str:
    """What a log may show of a webhook URL: its scheme and host (and port), never user, path or query."""
    try:
        u = urlsplit(url)
        host, port = u.hostname, u.port
    except ValueError:  # a port that is not a number
        return "an unparsable URL"
    if not u.scheme or not host:
        return "an unparsable URL"
    host = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{host}" + (f":{port}" if port else "")


def secrets_of(url: str) -> list[str]:
    """The parts of a webhook URL that no log may show, longest first: its path, query and fragment,
    each of their pieces, any `user:password@`, each raw, percent-decoded and percent-encoded."""
    try:
        u = urlsplit(url)
    except ValueError:  # nothing of it can be told apart: all of it
        return [url]
    user = u.netloc.rpartition("@")[0]
    found = {f"{u.path}?{u.query}", u.path, u.query, u.fragment, f"{user}@" if user else ""}
    found |= {p for p in re.split(r"[/?&=#;]", f"{u.path}?{u.query}#{u.fragment}") if len(p) >= 3}
    found |= {unquote(x) for x in found}
    found |= {quote(x, safe="/") for x in found}
    return sorted((x for x in found if x.strip("/")), key=len, reverse=True)


_lane = threading.local()  # the lane whose thread this is (a lane posts to its own URL only)


class HideWebhookUrls(logging.Filter):
    """httpx logs every request's whole URL at INFO: in a lane's thread, its URL shows scheme and host."""

    def filter(self, record: logging.LogRecord) -> bool:
        lane = getattr(_lane, "lane", None)
        if lane is not None and isinstance(record.args, tuple):
            record.args = tuple(lane.hidden(a) for a in record.args)
        return True


HIDE = HideWebhookUrls()


class Lane(Worker):
    """One webhook URL: its own queue and thread, so a hanging endpoint delays only its own messages."""

    final_pass = True  # what was queued before stop is still sent
    stop_timeout_s = 5.0

    def __init__(self, url: str, retries: int, name_job, number: int = 1) -> None:
        super().__init__()
        self.url, self.retries, self._name_job = url, retries, name_job
        # Its place in TUNEDECK_WEBHOOK_URLS tells apart two webhooks of one host (Slack's).
        self.name = f"webhook {number} ({origin(url)})"
        self._secrets = secrets_of(url)
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
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:  # its message may hold the URL (an HTTPStatusError's does)
                why = self.scrubbed(f"{type(e).__name__}: {e}")
            if self.stopping and attempt:  # at shutdown one retry, not a backoff of minutes
                break
            time.sleep(min(0.5 * 2**attempt, 30))
        log.warning("%s failed after %s tries: %s", self.name, attempt + 1, why)

    def hidden(self, arg: Any) -> Any:
        """A log record's argument as it may be shown: unchanged unless its text holds a secret."""
        text = str(arg)
        shown = self.scrubbed(text)
        return arg if shown == text else shown

    def scrubbed(self, text: str) -> str:
        """`text` with every secret part of this webhook's URL hidden."""
        for secret in self._secrets:
            text = text.replace(secret, HIDDEN)
        return text

    def run_once(self) -> None:
        if self._q.empty():
            return
        import httpx

        _lane.lane = self
        httpx_log = logging.getLogger("httpx")
        if HIDE not in httpx_log.filters:  # inert outside lanes' threads: added once, never taken back
            httpx_log.addFilter(HIDE)

        with httpx.Client(timeout=10) as client:
            while True:
                try:
                    payload = self._q.get_nowait()
                except queue.Empty:
                    return
                try:
                    self._post(client, payload)
                except Exception as e:  # the traceback, with whatever it says of the URL hidden
                    log.error(
                        "%s failed: %s", self.name, self.scrubbed("".join(traceback.format_exception(e)))
                    )


class Notifier(Worker):
    """Fans what callers queue out to one lane per URL; `put` never waits on the network."""

    name = "webhooks"
    interval_s = 3600.0  # the lanes do the work; this thread only owns their lifetime

    def __init__(self, settings: Settings, engine: Engine | None = None):
        super().__init__()
        self.engine = engine
        self.min_severity = settings.webhook_min_severity
        self.lanes = [
            Lane(url, settings.webhook_retries, self._job_name, number)
            for number, url in enumerate(settings.webhook_urls, 1)
        ]

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

"""Live updates over Server-Sent Events: one stream per page, resumable with Last-Event-ID."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Header, HTTPException, Query, Request
from sse_starlette.sse import EventSourceResponse

from tunedeck.api.answers import errors
from tunedeck.schemas import CursorOut
from tunedeck.services.live import feed
from tunedeck.services.live.events import TEAM

router = APIRouter(prefix="/api/stream", tags=["stream"])


def _cursor(last_event_id: str | None, cursor: str | None) -> feed.Cursor:
    # A reconnecting EventSource repeats the URL's cursor but sends Last-Event-ID: that one wins.
    try:
        return feed.Cursor.parse(last_event_id or cursor)
    except feed.BadCursor as e:
        loc = ["header", "last-event-id"] if last_event_id else ["query", "cursor"]
        raise HTTPException(
            status_code=422, detail=[{"loc": loc, "msg": str(e), "type": "value_error"}]
        ) from None


async def _follow(request: Request, job: int | None, cur: feed.Cursor):
    state = request.app.state
    settings, engine, hub = state.settings, state.engine, state.events
    limit, queue = settings.stream_batch_max, state.scheduler.queue
    waiting = False  # a queued job's place moves with every job's change: its page wakes with the team's
    while True:
        assumed = waiting
        woken = job if job and not waiting else TEAM
        ticket, since = hub.ticket(woken), hub.woken(woken)
        key = (job or TEAM, str(cur))
        if job is None:
            events, cur = await hub.shared(
                key,
                since,
                lambda c=cur: feed.team_events(engine, c, limit=limit, queue=queue),
                ticket=woken,
            )
            more = bool(events)
        else:
            events, cur, more = await hub.shared(
                key,
                since,
                lambda c=cur: feed.job_events(engine, job, c, limit=limit, queue=queue),
                ticket=woken,
            )
        for ev in events:
            if ev.event == "job":
                waiting = ev.data.get("status") == "queued"
            yield ev.sse()
        if not more and waiting == assumed:  # else read again under the other ticket first
            await hub.wait(ticket, settings.stream_ping_s)


# One event of the stream (OpenAPI 3.1: an event-stream schema describes each event).
EVENT = {
    "type": "object",
    "required": ["event", "data", "id"],
    "properties": {
        "event": {"enum": ["job", "metrics", "logs", "memory", "alerts", "jobs"]},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {
            "type": "string",
            "description": "the cursor after this event (send it back as Last-Event-ID)",
        },
    },
}


@router.get(
    "",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "events until the client leaves",
            "content": {"text/event-stream": {"schema": EVENT}},
        },
        **errors(404),
    },
)
async def stream(
    request: Request,
    job: Annotated[
        int | None, Query(ge=1, description="one job's stream; omit for the team's job rows")
    ] = None,
    cursor: Annotated[
        str | None, Query(description="start after this cursor (m<n>-l<n>-s<n>-a<n>-j<n>)")
    ] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """Server-Sent Events after a cursor: `job`, `metrics`, `logs`, `memory`, `alerts` (or `jobs`)."""
    cur = _cursor(last_event_id, cursor)
    if job is not None and not await anyio.to_thread.run_sync(
        lambda: feed.job_rows(request.app.state.engine, [job])
    ):
        raise HTTPException(status_code=404, detail=f"job {job} not found")
    events = request.app.state.events.counted(_follow(request, job, cur))
    return EventSourceResponse(
        events,
        ping=request.app.state.settings.stream_ping_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get("/cursor", response_model=CursorOut)
def now(request: Request) -> dict:
    """The cursor of the newest rows: load history up to it, then stream from it."""
    return {"cursor": str(feed.current_cursor(request.app.state.engine))}

"""Chat: start a chat job on a finished job, and its OpenAI-compatible endpoint through tunedeck.

Scripts point any OpenAI client at `<tunedeck>/api/jobs/{id}/v1` with a tunedeck token as the API
key; the model's own server listens on 127.0.0.1 only and wants a key that never leaves tunedeck.
Only the served job's owner, whoever started the chat and admins get through (services/chat.owners).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tunedeck.api import auth
from tunedeck.api.answers import Responses, errors
from tunedeck.api.deps import CREATES, NodeDep, SettingsDep, job_created, principal_name
from tunedeck.schemas import ChatStart, JobCreated
from tunedeck.services.jobs import chat as service
from tunedeck.services.jobs.records import get_job
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/jobs", tags=["chat"])
STARTING = "the chat server of job {id} does not answer yet (it loads the model first); retry shortly"
# The model server's answer as the client gets it: an OpenAI chat completion, or its event stream.
PASSED: Responses = {
    200: {
        "description": "the model server's answer",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.post("/{job_id}/chat", **CREATES, responses=errors(404, 409))
def start_chat(
    job_id: int,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    node: NodeDep,
    body: ChatStart | None = None,
) -> JobCreated:
    """Start a chat job serving a finished train or export job (its owner or an admin; queued like any job)."""
    served = get_job(session, job_id)
    _allowed(request, settings, (served.owner,), f"start a chat with job {job_id}")
    body = body or ChatStart()
    generating = body.model_dump(exclude={"gpus"}, exclude_none=True)
    made = service.start(
        session,
        settings=settings,
        node=node,
        job_id=job_id,
        gpus=body.gpus,
        generating=generating,
        owner=principal_name(request),
    )
    return job_created(request, session, made)


def _allowed(request: Request, settings, owners: tuple[str | None, ...], what: str) -> None:
    """401 without a token where writes are closed, 403 for a token that is no owner's or admin's: a chat
    holds a GPU and answers from someone's adapter (GET .../v1/models passes auth as a read)."""
    principal = getattr(request.state, "principal", None)
    if auth.may_act(principal, owners, settings):
        return
    if principal is None:
        raise HTTPException(
            401, detail=f"a token is required to {what}", headers={"WWW-Authenticate": "Bearer"}
        )
    named = ", ".join(sorted({o for o in owners if o})) or "nobody"
    raise HTTPException(403, detail=f"only its owner ({named}) or an admin may {what}")


async def _forward(request: Request, session, settings, job_id: int, path: str, body: bytes | None):
    """Pass one request to the chat server. Only a completion (a body) is use and resets the idle clock
    (which starts when the server first answers: services/chat.ChatIdle)."""
    import httpx

    job = service.chat_target(session, job_id)
    _allowed(request, settings, service.owners(session, job), f"chat with job {job_id}")
    engine = request.app.state.engine
    completing = body is not None
    if completing:
        await run_in_threadpool(service.touch, engine, job_id)
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
    upstream = client.build_request(
        "POST" if completing else "GET",
        f"http://127.0.0.1:{job.api_port}/v1/{path}",
        content=body,
        headers={"content-type": "application/json", "authorization": f"Bearer {job.api_key}"},
    )
    try:
        answer = await client.send(upstream, stream=True)
    except httpx.TransportError:
        await client.aclose()
        raise HTTPException(503, detail=STARTING.format(id=job_id), headers={"Retry-After": "2"}) from None

    async def relay():
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()
            await client.aclose()
            if completing:
                await run_in_threadpool(service.touch, engine, job_id)  # a long answer is use too

    kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "cache-control")}
    return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)


@router.get("/{job_id}/v1/models", response_class=Response, responses={**PASSED, **errors(404, 409)})
async def chat_models(job_id: int, request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """The chat server's model list (OpenAI `GET /v1/models`); 503 while it loads. Not use: no idle reset."""
    return await _forward(request, session, settings, job_id, "models", None)


@router.post(
    "/{job_id}/v1/chat/completions",
    response_class=Response,
    responses={**PASSED, **errors(404, 409, 413)},
)
async def chat_completions(
    job_id: int, request: Request, session: SessionDep, settings: SettingsDep
) -> Response:
    """OpenAI-compatible chat completion of a running chat job (`stream: true` streams the answer)."""
    body = await request.body()
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("messages"), list):
        raise HTTPException(
            422,
            detail=[
                {
                    "loc": ["body", "messages"],
                    "msg": "an OpenAI chat request: a JSON object with a list of `messages`",
                    "type": "value_error",
                }
            ],
        )
    return await _forward(request, session, settings, job_id, "chat/completions", body)

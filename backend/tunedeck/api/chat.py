"""Chat: start a chat job on a finished job, and its OpenAI-compatible endpoint through tunedeck.

Scripts point any OpenAI client at `<tunedeck>/api/jobs/{id}/v1` with a tunedeck token as the API
key; the model's own server listens on 127.0.0.1 only and wants a key that never leaves tunedeck.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from tunedeck.api.deps import CREATES, NodeDep, SettingsDep, job_created, principal_name
from tunedeck.api.responses import Responses, errors
from tunedeck.schemas import JobCreated
from tunedeck.services.jobs import chat as service
from tunedeck.services.jobs.records import create_job
from tunedeck.store.db import SessionDep

if TYPE_CHECKING:  # imported on use: the server and `tunedeck serve` start without it
    pass

router = APIRouter(prefix="/api/jobs", tags=["chat"])
STARTING = "the chat server of job {id} does not answer yet (it loads the model first); retry shortly"
# The model server's answer as the client gets it: an OpenAI chat completion, or its event stream.
PASSED: Responses = {
    200: {
        "description": "the model server's answer",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


class ChatStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(None, ge=0, le=64, description="GPUs for the chat server; 0 = CPU")
    max_new_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    do_sample: bool | None = Field(
        None, description="false: greedy answers (requests may still ask otherwise)"
    )


@router.post("/{job_id}/chat", **CREATES, responses=errors(404, 409))
def start_chat(
    job_id: int,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    node: NodeDep,
    body: ChatStart | None = None,
) -> JobCreated:
    """Start a chat job serving a finished train or export job (queued like any job)."""
    body = body or ChatStart()
    generating = body.model_dump(exclude={"gpus"}, exclude_none=True)
    spec = service.chat_spec(session, job_id=job_id, gpus=body.gpus, generating=generating)
    owner = principal_name(request)
    return job_created(
        request, session, create_job(session, settings=settings, spec=spec, node=node, owner=owner)
    )


async def _forward(request: Request, session, job_id: int, method: str, path: str, body: bytes | None):
    import httpx

    job = service.chat_target(session, job_id)
    engine = request.app.state.engine
    await run_in_threadpool(service.touch, engine, job_id)
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
    upstream = client.build_request(
        method,
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
            await run_in_threadpool(service.touch, engine, job_id)  # a long answer is use too

    kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "cache-control")}
    return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)


@router.get("/{job_id}/v1/models", response_class=Response, responses={**PASSED, **errors(404, 409)})
async def chat_models(job_id: int, request: Request, session: SessionDep) -> Response:
    """The chat server's model list (OpenAI `GET /v1/models`); 503 while it loads."""
    return await _forward(request, session, job_id, "GET", "models", None)


@router.post(
    "/{job_id}/v1/chat/completions",
    response_class=Response,
    responses={**PASSED, **errors(404, 409, 413)},
)
async def chat_completions(job_id: int, request: Request, session: SessionDep) -> Response:
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
    return await _forward(request, session, job_id, "POST", "chat/completions", body)

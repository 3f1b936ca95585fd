"""A job's run report: one HTML file with its config, checks, charts, alerts and environment."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from tunedeck.api.answers import WHY, Responses
from tunedeck.api.deps import NodeDep, SettingsDep
from tunedeck.checks import preflight
from tunedeck.schemas import Message
from tunedeck.services.jobs.records import get_job, slug
from tunedeck.services.views import report as service
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
# The answer is HTML, its errors JSON: FastAPI would document a model-typed error under the route's
# media type, so each one is spelled out (this router is mounted without COMMON for that reason).
ERRORS: Responses = {
    code: {"description": WHY[code], "content": {"application/json": {"schema": Message.model_json_schema()}}}
    for code in (401, 403, 404, 503, 507)
}


@router.get(
    "/{job_id}/report",
    response_class=HTMLResponse,
    responses={
        **ERRORS,
        200: {"content": {"text/html": {"schema": {"type": "string"}}}, "description": "an HTML file"},
    },
)
def job_report(job_id: int, session: SessionDep, settings: SettingsDep, node: NodeDep) -> HTMLResponse:
    """The job's run report as one self-contained HTML file (a download), readable offline."""
    job = get_job(session, job_id)
    # An import trained elsewhere: this server's preflight is not its environment (service.build).
    env = None if job.import_key else preflight.run(settings.train_python, ttl=settings.preflight_ttl_s)
    page = service.build(
        session, job, settings=settings, node=node, preflight=env, plotly_js=service.PLOTLY_JS
    )
    name = f"tunedeck-job-{job.id}-{slug(job.name)}.html"
    return HTMLResponse(page, headers={"Content-Disposition": f'attachment; filename="{name}"'})

"""Presets: the job and DeepSpeed configs shipped in configs/ (read-only) and the team's saved YAMLs."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from tunedeck.api import auth
from tunedeck.api.answers import Responses, errors
from tunedeck.api.deps import NodeDep, SettingsDep, principal_name
from tunedeck.schemas import Message, Preset, PresetIn, PresetText
from tunedeck.services.jobs import presets as service
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/presets", tags=["presets"])
TAKEN: Responses = {
    409: {"model": Message, "description": "the name is a shipped preset's (read-only) or a team preset's"}
}
SHIPPED: Responses = {409: {"model": Message, "description": "a shipped preset: read-only"}}


@router.get("", response_model=list[Preset])
def list_presets(session: SessionDep) -> list[dict]:
    """Shipped presets (`yaml` job configs, `json` DeepSpeed configs) and the team's, with owner and description."""
    return service.listing(session)


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=PresetText, responses={**TAKEN, **errors(413)}
)
def save_preset(
    body: PresetIn, request: Request, session: SessionDep, settings: SettingsDep, node: NodeDep
) -> dict:
    """Save a job YAML as a team preset, checked as a YAML submit is (422 at the same keys)."""
    return service.save(
        session,
        settings=settings,
        node=node,
        name=body.name,
        description=body.description,
        text=body.text,
        owner=principal_name(request),
    )


@router.get("/{name}", response_model=PresetText, responses=errors(404))
def get_preset(name: str, session: SessionDep) -> dict:
    """One preset with its text."""
    return service.read(session, name)


@router.delete("/{name}", response_model=Preset, responses={**errors(404), **SHIPPED})
def delete_preset(name: str, request: Request, session: SessionDep, settings: SettingsDep) -> dict:
    """Delete a team preset (its owner or an admin; shipped presets are read-only)."""
    principal = getattr(request.state, "principal", None)
    return service.delete(session, name=name, may=lambda owner: auth.may_act(principal, (owner,), settings))

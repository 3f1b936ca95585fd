"""Health, who is asking, and presets."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from sqlalchemy import text

from tunedeck import __version__
from tunedeck.api import auth
from tunedeck.api.answers import errors
from tunedeck.api.deps import SettingsDep
from tunedeck.api.guard import EXPOSED
from tunedeck.checks.presets import presets
from tunedeck.schemas import Health, Me, Preset, PresetText
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api", tags=["system"])


@router.get("/health", response_model=Health)
def health(request: Request, session: SessionDep) -> dict:
    """Liveness, version and what the scheduler sees (answers anyone: no paths); "degraded" and why
    while the disk is full, the workspace read-only or the database damaged."""
    session.execute(text("SELECT 1"))
    state = request.app.state
    status, reason = state.storage.state()
    return {
        "status": status,
        "reason": reason,
        "version": __version__,
        "executor": state.executor.name,
        "gpus": state.node_gpus,
        "cpu_slots": state.settings.cpu_slots,
        "near_oom_share": state.settings.alert_near_oom_share,
    }


@router.get("/me", response_model=Me)
def who_am_i(request: Request, settings: SettingsDep) -> dict:
    """Who is asking (the token's name and role; none in open mode) and what they may do: answers anyone."""
    principal = getattr(request.state, "principal", None)
    return {
        "name": principal.name if principal else None,
        "role": principal.role.value if principal else None,
        "open_read": auth.reads_open(settings, exposed=bool(request.scope.get(EXPOSED))),
        "open_write": settings.open_write,
        "may_submit": auth.may_submit(principal, settings),
        "acts_on": auth.acts_on(principal, settings),
    }


@router.get("/presets", response_model=list[Preset])
def list_presets() -> list[dict]:
    """Job configs (`yaml`) and DeepSpeed configs (`json`) shipped in the package (tunedeck/configs)."""
    return [{"name": k, "kind": p.suffix.lstrip(".")} for k, p in presets().items()]


@router.get("/presets/{name}", response_model=PresetText, responses=errors(404))
def get_preset(name: str) -> dict:
    """One preset's text."""
    p = presets().get(name)
    if p is None:
        raise HTTPException(status_code=404, detail=f"no preset {name!r}")
    return {"name": name, "kind": p.suffix.lstrip("."), "text": p.read_text()}

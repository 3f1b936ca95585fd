"""Health and who is asking."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from tunedeck import __version__
from tunedeck.api import auth
from tunedeck.api.deps import SettingsDep
from tunedeck.api.guard import EXPOSED
from tunedeck.schemas import Health, Me
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
        "chat_idle_s": state.settings.chat_idle_s,
        "integrity": state.integrity.said() if state.integrity is not None else None,
        "storage": state.upkeep.said(),
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

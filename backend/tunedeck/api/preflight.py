"""Preflight of a node's training environment (torch build, GPUs, ROCm, DeepSpeed, SMI)."""

from __future__ import annotations

import socket
from typing import Any

from fastapi import APIRouter, HTTPException

from tunedeck.api.answers import errors
from tunedeck.api.deps import SettingsDep
from tunedeck.checks import preflight
from tunedeck.schemas import Preflight

router = APIRouter(prefix="/api/nodes", tags=["nodes"])


@router.get("/{node}/preflight", response_model=Preflight, responses=errors(404))
def node_preflight(node: str, settings: SettingsDep, refresh: bool = False) -> dict[str, Any]:
    """Red/green checks of the node's training environment, each with its fix (cached)."""
    if node not in ("local", socket.gethostname()):
        raise HTTPException(
            status_code=404,
            detail=f"unknown node {node!r}: this server runs jobs on 'local' ({socket.gethostname()})",
        )
    return preflight.run(
        settings.train_python,
        ttl=settings.preflight_ttl_s,
        refresh=refresh,
        refresh_min_s=settings.preflight_refresh_min_s,
    )

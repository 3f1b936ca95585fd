"""The node inventory: this host's GPUs and which job holds each."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tunedeck.api.responses import Node

router = APIRouter(prefix="/api", tags=["nodes"])


@router.get("/nodes", response_model=list[Node])
def list_nodes(request: Request) -> list[dict]:
    """GPUs of this node (name, VRAM, utilisation, holder); `reason` says why GPU backends are absent."""
    return request.app.state.nodes.nodes()

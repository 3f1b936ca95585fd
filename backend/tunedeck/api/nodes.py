"""The node inventory: this host's GPUs and which job holds each."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request

from tunedeck.api.answers import errors
from tunedeck.schemas import Node

router = APIRouter(prefix="/api", tags=["nodes"])


@router.get("/nodes", response_model=list[Node], responses=errors(503))
def list_nodes(request: Request) -> list[dict]:
    """Each node's GPUs (VRAM, utilisation, power, temperatures, ECC, throttle, processes, holder): this host, or every cluster node, dead ones too."""
    source = request.app.state.executor.node_source
    try:
        return source.nodes()
    except Exception as e:  # the cluster is away: say where and why, not a 500
        raise HTTPException(
            status_code=503, detail=f"{source.where} unreachable: {type(e).__name__}: {e}"
        ) from e

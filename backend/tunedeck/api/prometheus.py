"""Prometheus scrape endpoint; reads follow the same token rules as /api (see auth.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

router = APIRouter(tags=["system"])


def registry_of(request: Request) -> CollectorRegistry:
    # prometheus_client is loaded by the first scrape, not by every start of a server nobody scrapes.
    from prometheus_client import CollectorRegistry, ProcessCollector

    from tunedeck.services.views.prometheus import Collector

    state = request.app.state
    registry = getattr(state, "prometheus", None)
    if registry is None:  # per app, not prometheus_client's global registry: tests start many apps
        registry = CollectorRegistry(auto_describe=False)
        tracker = state.alerts.tracker if getattr(state, "alerts", None) is not None else None
        registry.register(Collector(state.engine, writer=state.writer, events=state.events, tracker=tracker))
        ProcessCollector(registry=registry)  # the server's own CPU and resident memory
        # and its ingest store process's, while it runs (no process: nothing exported)
        ProcessCollector(
            namespace="tunedeck_ingest_store", pid=lambda: state.writer.store.pid, registry=registry
        )
        state.prometheus = registry
    return registry


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
def metrics(request: Request) -> Response:
    """Jobs' step, loss, tokens/s and VRAM; open alerts; queue; ingest backlog; live streams."""
    from prometheus_client.exposition import choose_encoder

    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encode(registry_of(request)), media_type=content_type)

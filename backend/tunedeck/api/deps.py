"""Shared route dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tunedeck.config import Settings
from tunedeck.services.nodes import node_preflight
from tunedeck.spec import SpecError
from tunedeck.submission import Node


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_node(request: Request) -> Node:
    """This node as a submission is checked against, from the cached inventory and preflight."""
    state = request.app.state
    cluster = getattr(state.executor, "cluster", None)
    if cluster is not None:  # Ray: the cluster's nodes; this host's hardware says nothing of them
        nodes = tuple(cluster())
        return Node(
            gpus=max((n.gpus for n in nodes if n.alive), default=0),
            cluster=nodes,
            probe=state.executor.workspace_problems,
        )
    return Node(
        gpus=state.node_gpus,
        preflight=node_preflight(state.settings),
        device_total_bytes=state.nodes.smallest_gpu_bytes() if state.node_gpus else None,
    )


NodeDep = Annotated[Node, Depends(get_node)]


def only_query(*names: str):
    """A dependency refusing query parameters other than `names` (422 at each), so a misspelt
    filter is an error rather than an unfiltered answer."""
    allowed = frozenset(names)

    def check(request: Request) -> None:
        unknown = [k for k in request.query_params if k not in allowed]
        if unknown:
            raise SpecError(
                [
                    {
                        "loc": ["query", k],
                        "msg": f"unknown query parameter; known: {', '.join(sorted(allowed))}",
                        "type": "extra_forbidden",
                    }
                    for k in unknown
                ]
            )

    return Depends(check)

"""Shared route dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tunedeck.config import Settings
from tunedeck.services.nodes import node_preflight
from tunedeck.submission import Node


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_node(request: Request) -> Node:
    """This node as a submission is checked against, from the cached inventory and preflight."""
    state = request.app.state
    return Node(
        gpus=state.node_gpus,
        preflight=node_preflight(state.settings),
        device_total_bytes=state.nodes.smallest_gpu_bytes() if state.node_gpus else None,
    )


NodeDep = Annotated[Node, Depends(get_node)]

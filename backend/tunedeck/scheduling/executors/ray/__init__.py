"""The Ray executor: a job's runners are detached actors in a placement group, one per node.

Ray is imported by `build` only: the actor module (`actor.py`) runs on the nodes and this package
is imported by name from the registry when `TUNEDECK_EXECUTOR=ray`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from tunedeck.config import Settings
from tunedeck.services.views.nodes import NodeInventory


def build(settings: Settings, *, engine: Engine, inventory: NodeInventory) -> Any:
    from tunedeck.scheduling.executors.ray.executor import RayExecutor  # imports ray

    return RayExecutor(settings, engine=engine)

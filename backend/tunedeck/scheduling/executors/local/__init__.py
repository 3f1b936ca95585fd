"""The local executor: each job's runner is a subprocess of this host (the default)."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from tunedeck.config import Settings
from tunedeck.scheduling.executors.local.executor import LocalExecutor
from tunedeck.services.views.nodes import NodeInventory


def build(settings: Settings, *, engine: Engine, inventory: NodeInventory) -> LocalExecutor:
    return LocalExecutor(settings, inventory)

"""Executors, registered by name: one folder each and one line in REGISTRY.

An executor is what the scheduler asks to place, start, follow and stop jobs (`base.Executor`); the
queue itself stays in SQLite. Each folder's package exposes `build(settings, *, engine, inventory)`.
The registry names modules, not classes, so an executor's own dependencies (Ray) are imported only
when the server is configured to use it. `TUNEDECK_EXECUTOR` picks one.
"""

from __future__ import annotations

import importlib

from sqlalchemy.engine import Engine

from tunedeck.config import Settings
from tunedeck.scheduling.executors.base import Executor
from tunedeck.services.views.nodes import NodeInventory

REGISTRY: dict[str, str] = {
    "local": "tunedeck.scheduling.executors.local",  # runners as subprocesses of this host
    "ray": "tunedeck.scheduling.executors.ray",  # detached actors in a placement group
    "slurm": "tunedeck.scheduling.executors.slurm",  # an sbatch job, srun one runner per node
}


def build(name: str, settings: Settings, *, engine: Engine, inventory: NodeInventory) -> Executor:
    """The executor registered as `name`, ready for the scheduler."""
    try:
        where = REGISTRY[name]
    except KeyError:
        raise ValueError(f"no executor named {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None
    return importlib.import_module(where).build(settings, engine=engine, inventory=inventory)

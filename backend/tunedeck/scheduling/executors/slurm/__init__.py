"""The Slurm executor: each job is an sbatch job; srun starts one runner per node in it.

`node.py` runs on the nodes (the batch script's command and each node's task); the executor proper
(`executor.py`) runs in the server and only calls Slurm's commands, never a shell.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from tunedeck.config import Settings
from tunedeck.services.views.nodes import NodeInventory


def build(settings: Settings, *, engine: Engine, inventory: NodeInventory) -> Any:
    from tunedeck.scheduling.executors.slurm.executor import SlurmExecutor

    return SlurmExecutor(settings, engine=engine)

"""An outbox line as the telemetry route would take it: the same model, the same device check.

A runner's outbox is read from the run folder, which the trainer (code the job chose) can write too,
so a line is taken only as a batch the route would have stored: by the scheduler when it finds a
runner gone, and by the outbox reader of the files transport (outboxes.py) all along.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from tunedeck.contract.protocol import TelemetryBatch
from tunedeck.services.ingest.devices import Devices, NotGiven
from tunedeck.services.ingest.writer import plain

log = logging.getLogger("tunedeck.services.ingest.replay")


def admitted(
    line: object, *, job_id: int, gpus: int, nodes: int, devices: Devices | None
) -> dict[str, Any] | None:
    """The batch as the writer takes it; None when the model refuses it; without its memory samples
    when they name a device the job was not given (its other items, the trainer's end above all, stay)."""
    try:
        out = plain(TelemetryBatch.model_validate(line))
    except ValidationError as e:
        log.warning("job %s: an outbox line is not a batch, skipped: %s", job_id, e.errors()[:1])
        return None
    if devices is not None:
        try:
            devices.admit(job_id=job_id, gpus=gpus, nodes=nodes, node=out["node"], memory=out["memory"])
        except NotGiven as e:
            log.warning(
                "job %s: outbox batch %s left without its memory samples: %s", job_id, out["seq"], e.msg
            )
            out["memory"] = []
    return out


def lines(data: bytes) -> list[object]:
    """The JSON values of whole lines; a line that is not JSON (torn by a kill mid-write) is skipped."""
    out: list[object] = []
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out

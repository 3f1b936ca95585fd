"""An outside run as `POST /api/runs/import` takes it: LLaMA-Factory's trainer_log.jsonl for given
losses, a memory CSV as the sampler writes it, and the import itself."""

from __future__ import annotations

import json

import numpy as np

# The runs' first second: fixed, so the same run gets the same alerts and chart times every time.
T0 = 1_800_000_000.0


def trainer_log(losses: list[float]) -> str:
    """One line per step, four seconds apart."""
    return "".join(
        json.dumps({"current_steps": k + 1, "total_steps": len(losses), "loss": v, "t": T0 + 4 * k}) + "\n"
        for k, v in enumerate(losses)
    )


def memory_csv(gpu: int, y: np.ndarray, total: int) -> str:
    """GPU `gpu` (-1: host memory) using `y` bytes of `total`, one sample a second."""
    rows = [f"{T0 + i:.1f},{gpu},{int(v)},{total}" for i, v in enumerate(y)]
    return "t,gpu,used_bytes,total_bytes\n" + "\n".join(rows) + "\n"


def decaying(n: int = 60) -> list[float]:
    """A healthy loss: an exponential decay with a little (seeded) noise."""
    rng = np.random.default_rng(0)
    return [float(2.5 * np.exp(-k / 15) + 1.0 + rng.normal(0, 0.03)) for k in range(n)]


def imported(api, name: str, losses: list[float], config: str = "", memory: str | None = None) -> dict:
    """The job the import made, through `api` (an app's or a server's client)."""
    files = {"trainer_log": trainer_log(losses).encode(), "config": config.encode()}
    if memory is not None:
        files["memory"] = memory.encode()
    r = api.post("/api/runs/import", files=files, data={"name": name})
    assert r.status_code == 201, r.text
    return r.json()

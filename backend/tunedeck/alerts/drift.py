"""One GPU of a job drifting away from its peers while they hold: `gpu_drift` (warning).

The ranks of a data-parallel job hold about the same memory, each at its own steady offset (rank 0
keeps a little more, uneven data moves each a little). What a person wants to hear of is one rank whose
level moves away from the others' while theirs stays: a leak on that rank only, a rank that started
getting far longer sequences, a process that stopped allocating (stuck, or doing other work).

Judged on each GPU's plateau blocks (`memory.Gpu`: a bounded summary of its whole run, so this keeps
no state of its own), put on a common time grid after warm-up, while every GPU reports. A block's level
is its mean floor (`memory.FLOOR_RANK`: the second lowest of each 9 samples), what the device stands on
between spikes: spikes at every optimizer step, up half the time, moved the smoothed median by their
height on one GPU and not on its peer (a drift told where there was none). For GPU i,
Δ_i is how far its level moved from the early part of that stretch (its 10th percentile over the
first eighth of the grid) to now (over the last eighth). Over a first quarter, a GPU that fell within
it (a process that stopped allocating soon after warm-up) was read as already fallen there: its
10th percentile stood on the new level. GPU i drifts when Δ_i less the median of its
peers' Δ exceeds DRIFT_SHARE of its card and DRIFT_MADS times the MAD of the peers' Δ (so that
peers that move about a lot do not single one out), while the peers hold: their own median move is
at most HOLD_SHARE of that drift (one GPU of two drifting: the other's level did not move). A GPU
that leaks while its peers hold gets both this and `vram_leak` (which adds the time left).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from tunedeck.alerts.memory import LOADING_S, Gpu
from tunedeck.alerts.series import Finding, Judging, device, gib, median

GRID = 64  # the common grid's points
DRIFT_SHARE = 0.05  # of the drifting GPU's card
DRIFT_MADS = 5.0  # of the MAD of the peers' moves
HOLD_SHARE = 0.5  # the peers' own median move, against the drift
DRIFT_MIN_S = 300.0  # the stretch judged: at least this long after warm-up
LOW = 10  # the percentile a stretch's level is read at: what eval phases and saves stand on
FREED = 0.5  # under this share of its usual level a GPU's memory was freed (the run ended)


def _moves(levels: np.ndarray) -> np.ndarray:
    """Each GPU's move (rows: GPUs, columns: the grid): now less early (the first and the last eighth),
    each the LOW percentile of its stretch (what eval phases and saves, which hold memory for a while on
    every GPU, stand on)."""
    early = np.percentile(levels[:, : GRID // 8], LOW, axis=1)
    now = np.percentile(levels[:, -(GRID // 8) :], LOW, axis=1)
    return now - early


def findings(
    gpus: Mapping[tuple[str, int], Gpu],
    j: Judging,
    loading: float = -math.inf,
    leaking: frozenset = frozenset(),
) -> list[Finding]:
    keys = [k for k in sorted(gpus) if k[1] >= 0 and gpus[k].n and gpus[k].total]
    if len(keys) < 2:  # a single GPU has no peers
        return []
    # A GPU's move lies within the range of its levels after warm-up (the grid interpolates between
    # them), and so does its peers' median move: no drift exceeds the widest range twice. Most
    # evaluations of most jobs end here (every evaluation reads this: on a cluster, hundreds of GPUs
    # a second); the (1-byte) margin is for rounding.
    blocks, widest = [], 0.0
    for k in keys:
        g = gpus[k]
        # The floor under spikes, not the smoothed median: spikes up half the time or more (every
        # optimizer step, sampled every few seconds) hold the median on their top for stretches.
        mid, _, _, first, level = g.block_levels()
        warm = (first >= max(5, g.n // 10)) & (mid >= max(loading, g.t_first + LOADING_S) + 60)
        if warm.sum() < 2:
            return []
        blocks.append((g, mid, level, warm))
        widest = max(widest, float(level[warm].max() - level[warm].min()))
    if 2 * widest < DRIFT_SHARE * min(gpus[k].total for k in keys) - 1.0:
        return []
    grid_from, grid_to, rows = -math.inf, math.inf, []
    for g, mid, level, warm in blocks:
        # Not the trailing blocks that no longer held the card (the process exiting frees it), nor the
        # one before them (it may hold the fall). Judged on the floor itself: it falls within 2 samples
        # of the card's release, the smoothed median only after 5, and blocks between the two read
        # the freed card as the level now.
        held = np.flatnonzero(level >= FREED * median(level[warm]))
        warm &= np.arange(len(mid)) < (held[-1] if len(held) else 0)
        if warm.sum() < 2:
            return []
        rows.append((mid[warm], level[warm]))
        grid_from, grid_to = max(grid_from, float(mid[warm][0])), min(grid_to, float(mid[warm][-1]))
    if grid_to - grid_from < DRIFT_MIN_S:
        return []
    grid = np.linspace(grid_from, grid_to, GRID)
    levels = np.array([np.interp(grid, mid, level) for mid, level in rows])
    moves = _moves(levels)
    out = []
    for i, k in enumerate(keys):
        peers = np.delete(moves, i)
        centre = median(peers)
        drift = float(moves[i]) - centre
        mad = 1.4826 * median(np.abs(peers - centre))
        total = gpus[k].total
        if abs(drift) <= max(DRIFT_SHARE * total, DRIFT_MADS * mad) or abs(centre) > HOLD_SHARE * abs(drift):
            continue
        out.append(_finding(k, gpus[k], j, grid, levels, i, drift, keys))
    return out


def _finding(
    key: tuple[str, int], g: Gpu, j: Judging, grid: np.ndarray, levels: np.ndarray, i: int, drift: float, keys
) -> Finding:
    node, gpu = key
    peers = np.delete(levels, i, axis=0)
    off = levels[i] - np.median(peers, axis=0)  # its offset from the peers' median, along the grid
    dev = np.abs(off - median(off[: GRID // 4]))
    half = int(np.argmax(dev >= abs(drift) / 2))
    calm = np.flatnonzero(dev[: half + 1] <= 0.2 * abs(drift))
    began = float(grid[int(calm[-1]) if len(calm) else 0])
    step = j.steps.step_at(began)
    when = f"step {step}" if step is not None else f"{began - g.t_first:.0f} s into the job"
    way = "rose" if drift > 0 else "fell"
    others = ", ".join(device(x) for _, x in (k for k in keys if k != key))
    msg = (
        f"{device(gpu)}: VRAM {way} {gib(abs(drift))} ({100 * abs(drift) / g.total:.0f}% of its {gib(g.total)}) "
        f"away from its peers' ({others}) from about {when} on, while theirs held: now {gib(float(levels[i, -1]))} "
        f"against their median {gib(median(peers[:, -1]))}"
    )
    cause = (
        "memory kept across steps on that rank only: a leak in code that runs on it alone (rank-0 logging, "
        "metrics or callbacks that keep tensors)"
        if drift > 0
        else "that rank no longer allocating what its peers do: a stuck or restarted process on it"
    )
    sug = (
        f"one rank's memory moving while the others hold points at that rank, not at the job's settings: "
        f"{cause}, or uneven data (its shard holds far longer sequences: shuffle the dataset or lower "
        "cutoff_len); compare torch.cuda.memory_allocated across ranks over a few steps and py-spy dump "
        f"the process on {device(gpu)} (the node page lists the GPU's processes)"
    )
    return Finding(
        "gpu_drift",
        "warning",
        gpu,
        [began, float(grid[-1])],
        step,
        msg,
        sug,
        j.running,
        node=node,
    )

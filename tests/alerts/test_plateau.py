"""The healthy plateau ("memory settled… the healthy flat line") never contradicts another finding and
needs a real settled window: at least 30 samples and 60 s, past the first samples, past the first
optimizer step and the learning-rate warm-up, after the last spike or near-OOM sample, and none at all
while a spike or near-OOM finding on that device is open. Each series is judged whole and in chunks."""

from __future__ import annotations

import random
import re

import numpy as np

from tests.alerts.test_streaming import chunked, key
from tunedeck.alerts import Point, Run, Series, analyze

GiB = 1024**3
TOTAL = 192 * GiB
T0 = 1_800_000_000.0


def judged(y: np.ndarray, *, step_s: float = 2.0, config=None, running=False, gpu=0, now=None) -> dict:
    mem = [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]
    pts = [Point(t=T0 + k * step_s, step=k, loss=2.0) for k in range(1, int(len(y) / step_s))]
    s = Series(memory={gpu: mem}, points=pts, config=config or {}, devices=[gpu], running=running, now=now)
    whole = analyze(s)
    assert key(chunked(s, random.Random(0)).findings(running=running, now=now)) == key(whole)
    return {f.kind: f for f in whole}


def flat(n: int, level: float = 40 * GiB) -> np.ndarray:
    return level + np.random.default_rng(n).normal(0, 0.02 * GiB, n)


def test_a_flat_line_of_a_few_seconds_is_no_plateau():
    """The CPU demo's case: a plateau at step 5 after 10 s. A minute of flat line is."""
    for n in (12, 29, 45):
        assert "vram_plateau" not in judged(flat(n)), n
    assert "vram_plateau" in judged(flat(130))


def test_the_settled_window_begins_after_the_learning_rate_warm_up():
    """warmup_steps 60 at a step every 2 s: the first 120 s are warm-up, whatever the memory does."""
    cfg = {"warmup_steps": 60}
    assert "vram_plateau" not in judged(flat(170), config=cfg)  # 50 s after warm-up: too short
    f = judged(flat(400), config=cfg)["vram_plateau"]
    settled_after = float(re.search(r"after (\d+) s", f.message).group(1))
    assert settled_after >= 120 and f.times[0] >= T0 + 120


def test_no_plateau_while_spikes_are_open_and_none_over_them():
    y = flat(400)
    y[300] += 20 * GiB
    # Live, the spike 100 s ago is open (it holds for 300 s): no healthy flat line beside it.
    live = judged(y, running=True, now=T0 + 399)
    assert live["vram_spike"].open and "vram_plateau" not in live
    # Over: the settled stretch starts after the spike, and 99 s of 360 is not half the run.
    assert "vram_plateau" not in judged(y)
    y = flat(400)
    y[150] += 20 * GiB
    # 249 s of flat line after the spike would do, but live the spike is still open: none yet.
    live = judged(y, running=True, now=T0 + 399)
    assert live["vram_spike"].open and "vram_plateau" not in live
    assert judged(y)["vram_plateau"].times[0] > T0 + 150
    y = flat(400)
    y[60] += 20 * GiB
    over = judged(y)  # a spike early on, then 340 s of flat line: settled after it
    assert over["vram_plateau"].times[0] > T0 + 60 and "vram_spike" in over
    # Spikes to the end of the run: never a plateau.
    y = flat(400)
    y[50::16] += 20 * GiB
    found = judged(y)
    assert "vram_periodic_spikes" in found and "vram_plateau" not in found


def test_no_plateau_beside_near_oom():
    y = flat(400, 0.9 * TOTAL)
    y[300:305] = 0.97 * TOTAL
    found = judged(y)
    assert "vram_near_oom" in found and "vram_plateau" not in found


def test_host_memory_is_named_so():
    y = flat(200, 3 * GiB)
    y[80] += 6 * GiB
    found = judged(y, gpu=-1)
    assert found["vram_spike"].message.startswith("host memory: 1 transient memory spike")
    assert found["vram_plateau"].message.startswith("host memory: memory settled")
    assert not any("GPU -1" in f.message for f in found.values())


def test_a_plateau_read_after_every_batch_is_the_plateau_of_the_samples_so_far():
    """Read live, after every batch and across the blocks' coarsenings (past 512 and 1024 samples),
    each read finds what a detector fed the same samples at once finds: what a read keeps between
    reads (the closed blocks as an array) follows the blocks."""
    y = np.concatenate([flat(700, 30 * GiB), flat(900, 45 * GiB)])
    rnd = random.Random(7)
    live, fed = Run(Series(devices=[0])), 0
    while fed < len(y):
        n = rnd.choice([1, 3, 17, 60])
        t = T0 + np.arange(fed, min(len(y), fed + n))
        live.feed_memory(0, t, y[fed : fed + len(t)], [TOTAL] * len(t))
        fed += len(t)
        if rnd.random() < 0.3 or fed == len(y):
            whole = Run(Series(devices=[0]))
            whole.feed_memory(0, T0 + np.arange(fed), y[:fed], [TOTAL] * fed)
            assert key(live.findings(running=False)) == key(whole.findings(running=False)), fed
    assert "vram_plateau" in {f.kind for f in live.findings(running=False)}

"""The hardware detectors judged by what must hold for any trace: ECC errors that rise during a job
(critical, naming GPU, node and block), correctable ones rising fast (warning), throttling while the
tokens/s drop (warning with its evidence), never without the drop or without the throttling; and
each trace fed whole (an import) and in random chunks, interleaved with the points (live), agrees."""

from __future__ import annotations

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.alerts.test_streaming import key
from tunedeck.alerts import Point, Run, Series, analyze
from tunedeck.alerts.hardware import CE_FAST, THROTTLE_DROP, THROTTLE_SHARE

T0 = 1_800_000_000.0
NODE = "mi300x-07"
RUNS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def trace(
    n: int,
    *,
    ue_at: int | None = None,
    ue: int = 2,
    ce: list[int] | None = None,
    throttle: list[float] | None = None,
    tps: list[float] | None = None,
    blocks_at: int | None = None,
) -> Series:
    """n samples a second on GPU 3 of NODE, one point every 2 s."""
    t = [T0 + i for i in range(n)]
    cols: dict[str, list] = {
        "ecc_uncorrectable": [ue if ue_at is not None and i >= ue_at else 0 for i in range(n)],
        "ecc_correctable": ce or [0] * n,
        "ecc_blocks": [None] * n,
        "throttle_power": throttle or [0.0] * n,
        "throttle_thermal": [0.0] * n,
        "throttle_hbm": [0.0] * n,
        "clock_mhz": [2100.0 - 800 * s for s in (throttle or [0.0] * n)],
    }
    if ue_at is not None:
        cols["ecc_blocks"][ue_at if blocks_at is None else blocks_at] = f"GFX=1/0,UMC=0/{ue}"
    points = [Point(T0 + 2 * k, k, loss=2.0, throughput=(tps[k] if tps else 1000.0)) for k in range(n // 2)]
    return Series(hardware={(NODE, 3): (t, cols)}, points=points, devices=[3], running=True, now=T0 + n)


def chunked(s: Series, rng: random.Random) -> Run:
    run = Run(s)
    (((node, gpu), (t, cols)),) = s.hardware.items()
    i, p = 0, 0
    while i < len(t) or p < len(s.points):
        if i < len(t) and (p >= len(s.points) or rng.random() < 0.5):
            n = rng.choice([1, 2, 3, 7, 40])
            run.feed_hardware(gpu, t[i : i + n], {k: v[i : i + n] for k, v in cols.items()}, node)
            i += n
        else:
            n = rng.choice([1, 2, 5, 13])
            run.feed_points(s.points[p : p + n])
            p += n
        if rng.random() < 0.1:
            run.findings(running=True, now=s.now)
    return run


def judged(s: Series, seed: int) -> list:
    whole = analyze(s)
    assert key(chunked(s, random.Random(seed)).findings(running=s.running, now=s.now)) == key(whole)
    return whole


@RUNS
@given(n=st.integers(30, 300), at=st.floats(0.05, 0.95), ue=st.integers(1, 50), seed=st.integers(0, 999))
def test_uncorrectable_errors_that_rise_during_the_job_are_critical_and_named(n, at, ue, seed):
    ue_at = max(1, int(at * n))
    (f,) = [f for f in judged(trace(n, ue_at=ue_at, ue=ue), seed) if f.kind == "gpu_ecc_uncorrectable"]
    assert f.severity == "critical" and f.gpu == 3 and f.node == NODE and f.open
    assert f.first == T0 + ue_at
    assert (
        f"GPU 3 on {NODE}: {ue} uncorrectable ECC error(s) during the job (0 → {ue}) in UMC ({ue})"
        == f.message
    )
    assert "checkpoint" in f.suggestion


@RUNS
@given(n=st.integers(30, 200), before=st.integers(1, 9), seed=st.integers(0, 999))
def test_errors_the_gpu_had_before_the_job_are_not_the_jobs(n, before, seed):
    s = trace(n)
    s.hardware[(NODE, 3)][1]["ecc_uncorrectable"] = [before] * n  # already there at its first sample
    assert not [f for f in judged(s, seed) if f.kind.startswith("gpu_ecc")]


@RUNS
@given(n=st.integers(60, 400), rate=st.integers(0, 40), seed=st.integers(0, 999))
def test_correctable_errors_warn_when_they_rise_fast(n, rate, seed):
    # `rate` new correctable errors a minute from the middle on (0: none)
    ce = [0 if i < n // 2 else rate * (i - n // 2) // 60 for i in range(n)]
    found = [f for f in judged(trace(n, ce=ce), seed) if f.kind == "gpu_ecc_correctable"]
    fast = max((ce[i] - ce[max(0, i - 600)] for i in range(n)), default=0) >= CE_FAST
    assert bool(found) == fast
    if found:
        assert found[0].severity == "warning" and found[0].node == NODE


@RUNS
@given(
    n=st.integers(80, 300),
    share=st.floats(0, 0.9),
    drop=st.floats(0, 0.6),
    seed=st.integers(0, 999),
)
def test_throttling_warns_only_with_a_tokens_per_second_drop(n, share, drop, seed):
    """From the middle on the GPU is throttled `share` of the time and the tokens/s fall by `drop`."""
    half = n // 2
    throttle = [0.0 if i < half else share for i in range(n)]
    tps = [1000.0 if 2 * k < half else 1000.0 * (1 - drop) for k in range(n // 2)]
    found = [f for f in judged(trace(n, throttle=throttle, tps=tps), seed) if f.kind == "gpu_throttle"]
    # A clear margin either way: a share and a drop near the thresholds may go either way.
    if share >= THROTTLE_SHARE + 0.02 and drop >= THROTTLE_DROP + 0.02 and n - half >= 70:
        (f,) = found
        assert f.severity == "warning" and f.node == NODE and f.gpu == 3 and f.open
        m = re.search(
            r"throttled (\d+)% .*\(power (\d+)%\) while tokens/s fell (\d+)% .*clock (\d+) MHz against 2100",
            f.message,
        )
        assert m, f.message
        assert abs(int(m[1]) - 100 * share) <= 1 and abs(int(m[3]) - 100 * drop) <= 1
    if share < THROTTLE_SHARE - 0.02 or drop < THROTTLE_DROP - 0.02:
        assert not found


def test_a_resent_sample_is_not_a_second_rise():
    s = trace(40, ue_at=10)
    run = Run(s)
    (t, cols) = s.hardware[(NODE, 3)]
    for _ in range(2):  # the same batch twice
        run.feed_hardware(3, t, cols, NODE)
    (f,) = [f for f in run.findings(running=True) if f.kind == "gpu_ecc_uncorrectable"]
    assert f.count == 1


def test_the_hardware_corpus_fed_in_chunks_equals_it_whole():
    from tests.alerts.corpus import hardware_corpus

    for seed, tr in enumerate(hardware_corpus(range(3))):
        assert {f.kind for f in judged(tr.series, seed)} == tr.labels, tr.name

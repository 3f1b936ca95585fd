"""The labelled corpus: every kind fires on the traces labelled with it and on no other, spikes are
found where they were put, and the advice quotes the trace's own config."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.alerts.corpus import corpus, generate, gradient_corpus, hardware_corpus
from tunedeck.alerts import KINDS, analyze

SEEDS = range(8)


def scores(traces) -> dict[str, tuple[float, float]]:
    tp, fp, fn = Counter(), Counter(), Counter()
    for tr in traces:
        fired = {f.kind for f in analyze(tr.series)}
        for k in KINDS:
            tp[k] += k in fired and k in tr.labels
            fp[k] += k in fired and k not in tr.labels
            fn[k] += k not in fired and k in tr.labels
    return {k: (tp[k] / max(1, tp[k] + fp[k]), tp[k] / max(1, tp[k] + fn[k])) for k in KINDS}


def test_every_kind_fires_where_labelled_and_nowhere_else():
    traces = corpus(SEEDS) + hardware_corpus(SEEDS) + gradient_corpus(SEEDS)
    for tr in traces:
        fired = {f.kind for f in analyze(tr.series)}
        assert fired == tr.labels, tr.name
    assert all(v == (1.0, 1.0) for v in scores(traces).values())


@pytest.mark.parametrize("seed", SEEDS)
def test_spikes_are_found_where_they_are(seed):
    for tr in generate(seed):
        if not tr.spike_times:
            continue
        (f,) = [f for f in analyze(tr.series) if f.kind in ("vram_spike", "vram_periodic_spikes")]
        assert sorted(f.times) == sorted(tr.spike_times), tr.name


def test_periodic_advice_names_the_config():
    tr = next(t for t in generate(0) if t.name == "periodic-ga8-0")
    (f,) = [f for f in analyze(tr.series) if f.kind == "vram_periodic_spikes"]
    assert "every 16.0 s" in f.message and "1.0 optimizer steps = 8 micro-batches" in f.message
    assert f.suggestion.startswith("the optimizer step's own working memory")
    assert "gradient_accumulation_steps is 8 and the spikes recur every 8 micro-batches" in f.suggestion
    assert "reduce_bucket_size from 5e8 to 5e7" in f.suggestion
    assert f.change is None  # the bucket's lower peak is text: its value needs the model's size


def test_fp16_oscillation_wants_bf16():
    tr = next(t for t in generate(1) if t.name.startswith("fp16-oscillation"))
    (f,) = [f for f in analyze(tr.series) if f.kind == "loss_oscillation"]
    assert "set bf16: true" in f.suggestion and "MI300X" in f.suggestion


def test_hang_blames_overlap_comm():
    tr = next(t for t in generate(2) if t.name.startswith("hang"))
    (f,) = [f for f in analyze(tr.series) if f.kind == "stall"]
    assert f.open and "overlap_comm: false" in f.suggestion


def test_spike_is_alerted_on_the_sample_of_its_peak():
    """Live, the engine sees the series grow sample by sample: a spike is alerted on the sample that
    rose (the samples after it only confirm it came back down)."""
    tr = next(t for t in generate(3) if t.name.startswith("single-spike"))
    s = tr.series
    full = s.memory[0]
    spike = tr.spike_times[0]
    for k in range(len(full)):
        s.memory[0] = full[: k + 1]
        s.now = full[k][0]
        if any(spike in f.times for f in analyze(s) if f.kind == "vram_spike"):
            assert s.now == spike
            return
    raise AssertionError("spike never alerted")

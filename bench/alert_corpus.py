"""Precision and recall per alert kind on the labelled corpus (tests/alerts/corpus.py), and how
many samples after a spike's peak the engine raises it when it sees the series grow live.

    python bench/alert_corpus.py [--seeds 40]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.alerts.corpus import corpus, generate

from tunedeck.alerts import KINDS, analyze


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    traces = corpus(range(args.seeds))
    tp, fp, fn, n = Counter(), Counter(), Counter(), Counter()
    t0 = time.perf_counter()
    for tr in traces:
        fired = {f.kind for f in analyze(tr.series)}
        for k in KINDS:
            n[k] += k in tr.labels
            tp[k] += k in fired and k in tr.labels
            fp[k] += k in fired and k not in tr.labels
            fn[k] += k not in fired and k in tr.labels
    per = (time.perf_counter() - t0) / len(traces)
    print(f"{len(traces)} traces ({args.seeds} seeds), {per * 1000:.1f} ms per 600-sample trace")
    print(f"{'kind':<22} {'labelled':>8} {'precision':>10} {'recall':>8}")
    for k in KINDS:
        prec = tp[k] / (tp[k] + fp[k]) if tp[k] + fp[k] else float("nan")
        rec = tp[k] / (tp[k] + fn[k]) if tp[k] + fn[k] else float("nan")
        print(f"{k:<22} {n[k]:>8} {prec:>10.3f} {rec:>8.3f}")
    # Live: the series grows one sample at a time; count samples from a single spike to its alert.
    delays = []
    for seed in range(min(args.seeds, 10)):
        tr = next(t for t in generate(seed) if t.name.startswith("single-spike"))
        full = list(tr.series.memory[0])
        for spike in tr.spike_times:
            k0 = next(i for i, x in enumerate(full) if x[0] == spike)
            for k in range(k0, len(full)):
                tr.series.memory[0], tr.series.now = full[: k + 1], full[k][0]
                if any(spike in f.times for f in analyze(tr.series) if f.kind == "vram_spike"):
                    delays.append(k - k0)
                    break
        tr.series.memory[0] = full
    print(
        f"single spikes alerted {Counter(delays)} sample(s) after the peak (1 sample = TUNEDECK_MEMORY_SAMPLE_S)"
    )


if __name__ == "__main__":
    main()

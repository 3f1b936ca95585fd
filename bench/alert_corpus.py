"""Precision and recall per alert kind on the labelled corpus (tests/alerts/corpus.py), and how
many samples after a spike's peak the engine raises it when it sees the series grow live; then the
same on the independent corpus of simulated LLaMA-Factory runs (tests/alerts/realistic.py), per
split: seeds 0-99 are the ones detectors may be tuned on, seeds 100-199 are held out.

    python bench/alert_corpus.py [--seeds 40] [--split held-out|tune|both] [--realistic-seeds 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.alerts import realistic
from tests.alerts.corpus import corpus, generate

from tunedeck.alerts import KINDS, analyze


def scores(labelled: list[tuple[set[str], set[str], set[str]]]) -> dict[str, tuple[int, float, float]]:
    """Per kind (labelled or fired): (traces labelled with it, precision, recall); each trace is
    (labels, kinds not scored on it, kinds fired)."""
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    n: Counter[str] = Counter()
    for labels, unsure, fired in labelled:
        for k in (labels | fired) - unsure:
            n[k] += k in labels
            tp[k] += k in fired and k in labels
            fp[k] += k in fired and k not in labels
            fn[k] += k not in fired and k in labels
    out = {}
    for k in sorted(n):
        prec = tp[k] / (tp[k] + fp[k]) if tp[k] + fp[k] else float("nan")
        rec = tp[k] / (tp[k] + fn[k]) if tp[k] + fn[k] else float("nan")
        out[k] = (n[k], prec, rec)
    return out


def raised(series) -> set[str]:
    """Kinds raised at warning or worse: the info plateau is a healthy finding, not an alarm."""
    return {f.kind for f in analyze(series) if f.severity != "info"}


def realistic_table(name: str, seeds: range) -> None:
    t0 = time.perf_counter()
    rows = []
    per_scenario: Counter[str] = Counter()
    for seed in seeds:
        for tr in realistic.generate(seed):
            got = raised(tr.series)
            rows.append((tr.labels, tr.unsure, got))
            per_scenario[tr.sim.scenario] += got - tr.unsure != tr.labels & set(KINDS)
    took = time.perf_counter() - t0
    print(
        f"\nrealistic corpus, {name} split (seeds {seeds.start}-{seeds.stop - 1}): {len(rows)} traces in {took:.0f} s"
    )
    print(f"{'kind':<22} {'labelled':>8} {'precision':>10} {'recall':>8}")
    for k, (n, prec, rec) in scores(rows).items():
        note = "" if k in KINDS else "  (no detector)"
        print(f"{k:<22} {n:>8} {prec:>10.3f} {rec:>8.3f}{note}")
    print(
        "traces not judged exactly right, per scenario: "
        + ", ".join(f"{k} {v}" for k, v in sorted(per_scenario.items()))
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--split", choices=["held-out", "tune", "both"], default="held-out")
    ap.add_argument(
        "--realistic-seeds", type=int, default=100, help="seeds per split of the realistic corpus"
    )
    ap.add_argument("--only-realistic", action="store_true")
    args = ap.parse_args()
    for name, seeds in (("tune", realistic.TUNE), ("held-out", realistic.HELD_OUT)):
        if args.split in (name, "both"):
            realistic_table(name, range(seeds.start, seeds.start + min(args.realistic_seeds, len(seeds))))
    if args.only_realistic:
        return
    traces = corpus(range(args.seeds))
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    n: Counter[str] = Counter()
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
            for at in range(k0, len(full)):
                tr.series.memory[0], tr.series.now = full[: at + 1], full[at][0]
                if any(spike in f.times for f in analyze(tr.series) if f.kind == "vram_spike"):
                    delays.append(at - k0)
                    break
        tr.series.memory[0] = full
    print(
        f"single spikes alerted {Counter(delays)} sample(s) after the peak (1 sample = TUNEDECK_MEMORY_SAMPLE_S)"
    )


if __name__ == "__main__":
    main()

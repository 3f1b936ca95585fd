"""Mutation score per module: how many of cosmic-ray's mutants of the code the relevant fast tests kill.

Slow (one test run per mutant), so not in CI. Works on a scratch copy of the tracked tree, never on the
checkout: cosmic-ray mutates files in place.

    python bench/mutation.py                 # every module below
    python bench/mutation.py estimate auth   # some of them
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# module name -> (path to mutate, the fast tests that cover it)
MODULES = {
    "estimate": (
        "backend/tunedeck/estimate.py",
        ["tests/estimate/test_estimate.py", "tests/estimate/test_truth.py"],
    ),
    "auth": ("backend/tunedeck/auth.py", ["tests/security/test_auth.py"]),
    "reach": ("backend/tunedeck/reach.py", ["tests/security/test_reach.py", "tests/test_spec.py"]),
    # The detectors' pure tests (no server, no subprocess): the CLI and import API around them are
    # covered by tests/alerts/test_outside_runs.py, too slow to run once per mutant.
    "alerts": (
        "backend/tunedeck/alerts",
        [
            "tests/alerts/test_corpus.py",
            "tests/alerts/test_early_spikes.py",
            "tests/alerts/test_realistic.py",
            "tests/alerts/test_traces.py",
            "tests/alerts/test_units.py",
        ],
    ),
}
CONFIG = """[cosmic-ray]
module-path = "{path}"
timeout = {timeout}
excluded-modules = []
test-command = "{python} -m pytest -x -q -p no:cacheprovider {tests}"

[cosmic-ray.distributor]
name = "local"
"""


def scratch_copy() -> Path:
    """The tracked and untracked-but-not-ignored files, as the tests see them."""
    dest = Path(tempfile.mkdtemp(prefix="tunedeck-mutation-"))
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def score(session: Path) -> tuple[int, int, int]:
    """(mutants, killed, survived) from cosmic-ray's session database."""
    with sqlite3.connect(session) as db:
        outcomes = [r[0] for r in db.execute("SELECT test_outcome FROM work_results")]
    killed = sum(o in ("KILLED", "TestOutcome.KILLED") for o in outcomes)
    survived = sum(o in ("SURVIVED", "TestOutcome.SURVIVED") for o in outcomes)
    return len(outcomes), killed, survived


def keep_sample(session: Path, n: int, seed: int) -> int:
    """Keep a random n of the mutants (a module yields hundreds to thousands); returns how many there were."""
    with sqlite3.connect(session) as db:
        # job ids are random per init: order by what the mutant is, so a seed draws the same mutants.
        jobs = [
            r[0]
            for r in db.execute(
                "SELECT job_id FROM mutation_specs ORDER BY module_path, operator_name, occurrence, "
                "start_pos_row, start_pos_col"
            )
        ]
        keep = set(random.Random(seed).sample(jobs, min(n, len(jobs))))
        drop = [(j,) for j in jobs if j not in keep]
        db.executemany("DELETE FROM mutation_specs WHERE job_id = ?", drop)
        db.executemany("DELETE FROM work_items WHERE job_id = ?", drop)
    return len(jobs)


def run(name: str, work: Path, timeout: float, sample: int | None, seed: int) -> dict:
    path, tests = MODULES[name]
    tests = [t for t in tests if (work / t).exists()]  # an older tree (a "before" score) may lack some
    cosmic = Path(sys.executable).with_name("cosmic-ray")
    config, session = work / f"mutation-{name}.toml", work / f"mutation-{name}.sqlite"
    config.write_text(CONFIG.format(path=path, timeout=timeout, python=sys.executable, tests=" ".join(tests)))
    # The scratch copy's code must win over the editable install of the checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / "backend"), str(work)])}
    started = time.monotonic()
    subprocess.run([str(cosmic), "init", str(config), str(session)], cwd=work, env=env, check=True)
    generated = keep_sample(session, sample, seed) if sample else None
    baseline = subprocess.run([str(cosmic), "baseline", str(config)], cwd=work, env=env, check=False)
    if baseline.returncode != 0:
        raise SystemExit(f"{name}: the tests fail on the unmutated code; fix them first")
    subprocess.run([str(cosmic), "exec", str(config), str(session)], cwd=work, env=env, check=True)
    total, killed, survived = score(session)
    return {
        "module": name,
        "mutants": total,
        "generated": generated or total,
        "killed": killed,
        "survived": survived,
        "score": killed / total if total else None,
        "seconds": time.monotonic() - started,
        "session": str(session),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--sample", type=int, help="run a random subset of this many mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --sample draw")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one mutant's test run may take")
    args = parser.parse_args()
    if unknown := set(args.modules) - set(MODULES):
        parser.error(f"unknown module(s) {sorted(unknown)}: choose from {', '.join(MODULES)}")
    work = scratch_copy()
    print(f"scratch copy: {work} (session databases stay there; `cr-report <db>` lists survivors)")
    for name in args.modules or MODULES:
        r = run(name, work, args.timeout, args.sample, args.seed)
        pct = f"{100 * r['score']:.1f} %" if r["score"] is not None else "-"
        print(
            f"{r['module']:<10} score {pct:>7}  ({r['killed']} killed, {r['survived']} survived of "
            f"{r['mutants']} mutants run of {r['generated']}) in {r['seconds']:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Mutation score per module: how many of cosmic-ray's mutants of the code the module's own fast tests kill.

Slow (one test run per mutant), so not in CI. Works on a scratch copy of the tree, never on the
checkout: cosmic-ray mutates files in place.

    python bench/mutation.py                                  # every module below, every mutant
    python bench/mutation.py reach auth --sample 25 --seed 7  # a seeded random 25 of each
    python bench/mutation.py memory --sample 25 --seed 7 --tree 7f908fc   # the same draw on an older tree
    python bench/mutation.py memory --sample 25 --seed 7 --tests-from 7f908fc  # same mutants, older tests
    python bench/mutation.py ... --record bench/mutation_scores.md        # append the scores there

Each module runs only the tests that cover it, fast ones first (a run stops at its first failure),
never a real fine-tune (auth keeps its in-process app and loopback server tests, estimate its CLI
test), and pytest without its auto-loaded plugins (schemathesis and hypothesis cost ~5 s a start,
most of a run): a sample of 25 mutants takes 5-20 minutes on a loaded 2-core machine. Survivors are printed with their diff. A
mutant that cannot change behaviour (an annotation never evaluated, a line marked
`# pragma: no mutate` with the reason above it) is not drawn.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import datetime
import io
import json
import os
import py_compile
import random
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REACH_TESTS = ("tests/test_spec.py", "tests/security/test_reach.py", "-m", "not slow")
# The one server test of test_reach.py: a real server for what resolve() already shows in-process.
NO_SERVER = ("--deselect", "tests/security/test_reach.py::test_submission_refuses_remote_code_at_the_field")


@dataclass(frozen=True)
class Module:
    path: str  # a file or folder to mutate
    tests: tuple[str, ...]  # pytest arguments: the fast tests first (a run stops at its first failure)
    functions: tuple[str, ...] = ()  # when given, only mutants inside these functions or classes


MODULES = {
    "estimate": Module(
        "backend/tunedeck/checks/estimate.py",
        ("tests/estimate/test_estimate.py", "tests/estimate/test_truth.py"),
    ),
    # test_body_limits is the body guard's (tunedeck.api.guard), not the tokens'.
    "auth": Module(
        "backend/tunedeck/api/auth.py",
        ("tests/security/test_auth.py", "--deselect", "tests/security/test_auth.py::test_body_limits"),
    ),
    "reach": Module("backend/tunedeck/checks/reach.py", (*REACH_TESTS, *NO_SERVER)),
    # Where the submission pipeline confines the spec's own files (DeepSpeed JSON, model config.json).
    "spec": Module(
        "backend/tunedeck/checks/submission.py",
        (*REACH_TESTS, *NO_SERVER),
        functions=("_deepspeed", "_model_config"),
    ),
    "memory": Module(
        "backend/tunedeck/alerts/memory.py",
        (
            "tests/alerts/test_units.py",
            "tests/alerts/test_early_spikes.py",
            "tests/alerts/test_traces.py",
            "tests/alerts/test_plateau.py",
            "tests/alerts/test_corpus.py",
            "tests/alerts/test_realistic.py",
            "tests/alerts/test_properties.py",
            "tests/alerts/test_bulk.py",
            "tests/alerts/test_causes.py",
        ),
    ),
    "training": Module(
        "backend/tunedeck/alerts/training.py",
        (
            "tests/alerts/test_units.py",
            "tests/alerts/test_traces.py",
            "tests/alerts/test_stuck.py",
            "tests/alerts/test_stall.py",
            "tests/alerts/test_causes.py",
            "tests/alerts/test_corpus.py",
            "tests/alerts/test_realistic.py",
        ),
    ),
    # One GPU moving away from its peers (issue 28 §3).
    "drift": Module(
        "backend/tunedeck/alerts/drift.py", ("tests/alerts/test_drift.py", "tests/alerts/test_corpus.py")
    ),
    # The flat loss judged against its noise under a learning rate of about 0 (issue 28 §3).
    "lr_stuck": Module(
        "backend/tunedeck/alerts/training.py",
        ("tests/alerts/test_lr_stuck.py", "tests/alerts/test_stuck.py", "tests/alerts/test_corpus.py"),
        functions=("Training.lr_tiny", "Training._lr_flat", "Training.lr_ramp", "Training._lr_stuck"),
    ),
    # The writer's storing of a batch: rows, progress, nodes and the exit report (no server).
    "ingest": Module(
        "backend/tunedeck/services/ingest/writer.py",
        ("tests/test_ingest.py",),
        functions=("memory_columns", "insert_memory", "final_status", "apply_batch"),
    ),
    # The whole folder, as scored before memory and training had their own rows.
    "alerts": Module(
        "backend/tunedeck/alerts",
        (
            "tests/alerts/test_units.py",
            "tests/alerts/test_early_spikes.py",
            "tests/alerts/test_traces.py",
            "tests/alerts/test_corpus.py",
            "tests/alerts/test_realistic.py",
        ),
    ),
}
DEFAULT = [m for m in MODULES if m != "alerts"]
NO_MUTATE = "# pragma: no mutate"
CONFIG = """[cosmic-ray]
module-path = {path}
timeout = {timeout}
excluded-modules = []
test-command = {command}

[cosmic-ray.distributor]
name = "local"
"""


def extract(rev: str, dest: Path, *paths: str) -> None:
    archive = subprocess.run(
        ["git", "archive", rev, *paths], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def scratch_copy(tree: str | None, tests_from: str | None) -> Path:
    """The files the tests see: the checkout's tracked and untracked-but-not-ignored files, or a
    commit's; with `tests_from`, that commit's tests/ instead of the copy's own."""
    dest = Path(tempfile.mkdtemp(prefix="tunedeck-mutation-"))
    if tree:
        extract(tree, dest)
    else:
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
    if tests_from:
        shutil.rmtree(dest / "tests")
        extract(tests_from, dest, "tests")
    # cosmic-ray runs the tests with PYTHONDONTWRITEBYTECODE, so without these every run compiles the
    # whole tree again. Checked-hash .pyc files are re-validated against the source at each import: a
    # mutant (same size, same second) is never served from a stale one.
    for folder in ("backend", "trainer", "tests"):
        compileall.compile_dir(
            dest / folder, quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
        )
    return dest


def spans(source: Path, names: tuple[str, ...]) -> list[tuple[int, int]]:
    """The line ranges of the named top-level functions and classes, and of methods as `Class.name`."""
    tree = ast.parse(source.read_text())
    found = {n.name: (n.lineno, n.end_lineno or n.lineno) for n in tree.body if hasattr(n, "name")}
    for c in tree.body:
        if isinstance(c, ast.ClassDef):
            found |= {
                f"{c.name}.{n.name}": (n.lineno, n.end_lineno or n.lineno)
                for n in c.body
                if hasattr(n, "name")
            }
    if missing := set(names) - set(found):
        raise SystemExit(f"{source}: no function or class {sorted(missing)}")
    return [found[n] for n in names]


def annotation_spans(source: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the type annotations are, in a module that never evaluates them (`from __future__ import
    annotations`, no pydantic model): a mutant there (`str | None` -> `str + None`) cannot change behaviour."""
    text = source.read_text()
    tree = ast.parse(text)
    lazy = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not lazy or "pydantic" in text:
        return []
    out = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            found = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found = [node.annotation]
        out += [
            ((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset))
            for n in found
            if n is not None and n.end_lineno is not None and n.end_col_offset is not None  # parsed: always
        ]
    return out


def keep(session: Path, work: Path, n: int | None, seed: int, within: list[tuple[int, int]] | None) -> int:
    """Keep the mutants inside `within`, outside annotations and off waived lines, then a seeded random
    n of them; returns how many were eligible."""
    with sqlite3.connect(session) as db:
        rows = db.execute(
            "SELECT job_id, module_path, start_pos_row, start_pos_col FROM mutation_specs ORDER BY "
            "module_path, operator_name, occurrence, start_pos_row, start_pos_col"
        ).fetchall()
        inert = {path: annotation_spans(work / path) for path in {r[1] for r in rows}}
        # A line marked `# pragma: no mutate` says, above it, why its mutants cannot change what matters.
        waived = {
            path: {i for i, line in enumerate((work / path).read_text().splitlines(), 1) if NO_MUTATE in line}
            for path in inert
        }
        # job ids are random per init: the order above (what the mutant is) makes a seed draw the same.
        jobs = [
            j
            for j, path, row, col in rows
            if (within is None or any(a <= row <= b for a, b in within))
            and not any(a <= (row, col) < b for a, b in inert[path])
            and row not in waived[path]
        ]
        chosen = set(random.Random(seed).sample(jobs, n) if n and n < len(jobs) else jobs)
        drop = [(j,) for j, *_ in rows if j not in chosen]
        db.executemany("DELETE FROM mutation_specs WHERE job_id = ?", drop)
        db.executemany("DELETE FROM work_items WHERE job_id = ?", drop)
    return len(jobs)


def outcomes(session: Path) -> list[tuple[str, str, str, int]]:
    """(outcome, operator, diff, line) per mutant run."""
    with sqlite3.connect(session) as db:
        return db.execute(
            "SELECT r.test_outcome, s.operator_name, r.diff, s.start_pos_row FROM work_results r "
            "JOIN mutation_specs s ON s.job_id = r.job_id ORDER BY s.module_path, s.start_pos_row"
        ).fetchall()


def run(name: str, work: Path, args: argparse.Namespace) -> dict:
    mod = MODULES[name]
    # an older tree (a "before" score) may lack some test files
    tests = [t for t in mod.tests if not t.startswith("tests/") or (work / t.split("::")[0]).exists()]
    pytest = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "pytest_timeout",
        *tests,
    ]
    env = {
        **os.environ,
        # The scratch copy's code must win over the editable install of the checkout.
        "PYTHONPATH": os.pathsep.join([str(work / "backend"), str(work / "trainer"), str(work)]),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    # The demo model and datasets, built once for every mutant's run rather than once each.
    env.setdefault("TUNEDECK_TEST_ASSETS", str(work / "test-assets"))
    started = time.monotonic()
    base = subprocess.run(pytest, cwd=work, env=env, capture_output=True, text=True)
    if base.returncode != 0:
        raise SystemExit(
            f"{name}: the tests fail on the unmutated code; fix them first\n{base.stdout[-3000:]}"
        )
    # A mutant that loops forever counts as killed once it takes this long.
    timeout = args.timeout or max(60.0, 5 * (time.monotonic() - started))
    cosmic = Path(sys.executable).with_name("cosmic-ray")
    config, session = work / f"mutation-{name}.toml", work / f"mutation-{name}.sqlite"
    config.write_text(
        CONFIG.format(path=json.dumps(mod.path), timeout=timeout, command=json.dumps(shlex.join(pytest)))
    )
    subprocess.run([str(cosmic), "init", str(config), str(session)], cwd=work, env=env, check=True)
    within = spans(work / mod.path, mod.functions) if mod.functions else None
    eligible = keep(session, work, args.sample, args.seed, within)
    subprocess.run([str(cosmic), "exec", str(config), str(session)], cwd=work, env=env, check=True)
    results = outcomes(session)
    killed = sum(o.endswith("KILLED") for o, *_ in results)
    return {
        "module": name,
        "mutants": len(results),
        "eligible": eligible,
        "killed": killed,
        "survivors": [(line, op, diff) for o, op, diff, line in results if o.endswith("SURVIVED")],
        "score": killed / len(results) if results else None,
        "seconds": time.monotonic() - started,
    }


def commit_of(tree: str | None) -> str:
    rev = subprocess.run(
        ["git", "rev-parse", "--short", tree or "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = (
        not tree
        and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "backend", "tests"], cwd=ROOT).returncode
        != 0
    )
    return rev + ("+changes" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all but alerts)")
    parser.add_argument("--sample", type=int, help="run a random subset of this many mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --sample draw")
    parser.add_argument("--tree", help="score this commit's code and tests instead of the checkout")
    parser.add_argument(
        "--tests-from",
        help="with this commit's tests: the same mutants judged by older tests (a paired before)",
    )
    parser.add_argument(
        "--timeout", type=float, help="seconds one mutant's test run may take (default: 5x baseline)"
    )
    parser.add_argument("--record", type=Path, help="append one table row per module to this markdown file")
    parser.add_argument("--label", default="", help="what the row measures (before, after, ...)")
    args = parser.parse_args()
    if unknown := set(args.modules) - set(MODULES):
        parser.error(f"unknown module(s) {sorted(unknown)}: choose from {', '.join(MODULES)}")
    work = scratch_copy(args.tree, args.tests_from)
    commit = commit_of(args.tree) + (f" tests of {commit_of(args.tests_from)}" if args.tests_from else "")
    print(f"scratch copy of {commit}: {work} (`cr-report <db>` there lists every mutant)")
    for name in args.modules or DEFAULT:
        r = run(name, work, args)
        pct = f"{100 * r['score']:.1f} %" if r["score"] is not None else "-"
        print(
            f"{r['module']:<10} score {pct:>7}  ({r['killed']} killed of {r['mutants']} run, drawn from "
            f"{r['eligible']}) in {r['seconds']:.0f} s",
            flush=True,
        )
        for line, op, diff in r["survivors"]:
            changed = [d for d in (diff or "").splitlines() if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            print(f"  survived: line {line} {op.split('/')[-1]}: {' | '.join(changed)}")
        if args.record:
            day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
            sample = args.sample or "all"
            with args.record.open("a") as f:
                f.write(
                    f"| {day} | {commit} | {args.label} | {r['module']} | {args.seed} | {sample} | "
                    f"{r['killed']}/{r['mutants']} | {pct} | {r['eligible']} | {r['seconds']:.0f} |\n"
                )


if __name__ == "__main__":
    main()

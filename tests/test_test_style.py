"""How tests wait, read from their source: one shared helper polls (tests/utils/wait.py), and no test
keys a check to how long something took."""

from __future__ import annotations

import ast
import functools
import itertools
import textwrap

import pytest

from tests.conftest import ROOT

TESTS = ROOT / "tests"
WAIT = TESTS / "utils" / "wait.py"
# What the checks must find, kept as text (not .py) so no scan, collector or linter takes it for code.
# Modules that do arithmetic on a clock for something other than waiting; no assert compares what
# they read.
CLOCKS = {
    "tests/security/test_fuzz.py": "tallies the seconds each fuzz operation took, for the run's report",
    "tests/test_node_telemetry.py": "dates its scripted samples half a minute back, as a runner's are",
}
SLEEPS = {"sleep", "wait_for_timeout"}
TIMERS = {"monotonic", "perf_counter", "monotonic_ns", "perf_counter_ns"}


def called(node: ast.AST, names: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in names) or (isinstance(f, ast.Name) and f.id in names)


def polling_loops(tree: ast.AST) -> list[int]:
    """Lines of loops that sleep (`while ...: ... time.sleep(...)`), also in code kept in a string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)):
            if any(called(n, SLEEPS) for n in ast.walk(node)):
                found.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and any(s in node.value for s in SLEEPS)
        ):
            try:
                inner = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            found += [node.lineno for _ in polling_loops(inner)]
    return found


def clock_reads(tree: ast.AST) -> list[int]:
    """Reads of a timer clock, and comparisons or sums involving any clock (`time.time() + 120`)."""
    found = [n.lineno for n in ast.walk(tree) if called(n, TIMERS)]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            or (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)))
        ) and any(called(n, TIMERS | {"time"}) for n in ast.walk(node)):
            found.append(node.lineno)
    return sorted(set(found))


@functools.cache  # parsed once for both checks
def modules() -> dict[str, ast.AST]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in sorted(TESTS.rglob("*.py")) if p != WAIT
    }


def _call(module: str, name: str, *args: float) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(module), name), [ast.Constant(a) for a in args], [])


def _sample(timer: str, sleep: str) -> ast.AST:
    """A private deadline loop, and a child script in a string that sleeps in a loop, built as syntax
    from the names the checks look for (so no such code stands in any file), then parsed back:
        deadline = time.<timer>() + 120
        while not ready():
            assert time.<timer>() < deadline
            time.<sleep>(0.1)
        CHILD = 'for _ in range(100):\n    time.<sleep>(0.1)'"""
    child = ast.For(
        ast.Name("_", ast.Store()),
        ast.Call(ast.Name("range"), [ast.Constant(100)], []),
        [ast.Expr(_call("time", sleep, 0.1))],
        [],
    )
    body = [
        ast.Assign(
            [ast.Name("deadline", ast.Store())], ast.BinOp(_call("time", timer), ast.Add(), ast.Constant(120))
        ),
        ast.While(
            ast.UnaryOp(ast.Not(), ast.Call(ast.Name("ready"), [], [])),
            [
                ast.Assert(ast.Compare(_call("time", timer), [ast.Lt()], [ast.Name("deadline")])),
                ast.Expr(_call("time", sleep, 0.1)),
            ],
            [],
        ),
        ast.Assign(
            [ast.Name("CHILD", ast.Store())],
            ast.Constant(ast.unparse(ast.fix_missing_locations(ast.Module([child], [])))),
        ),
    ]
    return ast.parse(ast.unparse(ast.fix_missing_locations(ast.Module(body, []))))


@pytest.mark.parametrize(("timer", "sleep"), list(itertools.product(sorted(TIMERS), sorted(SLEEPS))))
def test_the_checks_find_a_private_polling_loop(timer, sleep):
    tree = _sample(timer, sleep)
    assert polling_loops(tree) == [2, 5]  # the loop, and the string that holds one
    assert clock_reads(tree) == [1, 3]  # the deadline set, and the deadline compared


def test_only_the_shared_helper_polls():
    found = [f"{name}:{line}" for name, tree in modules().items() for line in polling_loops(tree)]
    assert found == []


def test_no_test_reads_a_clock_to_wait_or_to_judge_speed():
    found = [f"{name}:{line}" for name, tree in modules().items() for line in clock_reads(tree)]
    assert sorted({f.split(":")[0] for f in found}) == sorted(CLOCKS), found

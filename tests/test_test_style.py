"""How tests wait, read from their source: one shared helper polls (tests/utils/wait.py), and no test
keys a check to how long something took."""

from __future__ import annotations

import ast
import functools
import itertools
import textwrap

import pytest

from tests.utils.servers import ROOT
from tests.utils.wait import CLOCKS, PAUSES

TESTS = ROOT / "tests"
WAIT = TESTS / "utils" / "wait.py"
# Modules that do arithmetic on a clock for something other than waiting; no assert compares what
# they read.
CLOCK_USERS = {
    "tests/security/test_fuzz.py": "tallies the seconds each fuzz operation took, for the run's report",
    "tests/test_node_telemetry.py": "dates its scripted samples half a minute back, as a runner's are",
    "tests/test_stacks.py": "dates a batch's points hours back, so that the job has stalled",
    "tests/ui/test_alerts_ui.py": "dates a batch's points hours back, so that the job has stalled",
}


def called(node: ast.AST, names: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in names) or (isinstance(f, ast.Name) and f.id in names)


def polling_loops(tree: ast.AST) -> list[int]:
    """Lines of loops that pause (any of PAUSES called inside a while or for), also in code kept in a
    string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)):
            if any(called(n, PAUSES) for n in ast.walk(node)):
                found.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and any(s in node.value for s in PAUSES)
        ):
            try:
                inner = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            found += [node.lineno for _ in polling_loops(inner)]
    return found


def clock_reads(tree: ast.AST) -> list[int]:
    """Reads of one of CLOCKS, and comparisons, sums or differences that involve any clock (the wall
    clock's `time` included)."""
    found = [n.lineno for n in ast.walk(tree) if called(n, CLOCKS)]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            or (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)))
        ) and any(called(n, CLOCKS | {"time"}) for n in ast.walk(node)):
            found.append(node.lineno)
    return sorted(set(found))


@functools.cache  # parsed once for both checks
def modules() -> dict[str, ast.AST]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in sorted(TESTS.rglob("*.py")) if p != WAIT
    }


def _call(module: str, name: str, *args: float) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(module), name), [ast.Constant(a) for a in args], [])


def _sample(clock: str, pause: str) -> ast.AST:
    """Syntax the checks must find, built from the names they look for (so no such code stands in any
    file), then parsed back. Line 1 sets a deadline from `clock`; line 2 loops until ready; line 3
    asserts `clock` is before the deadline; line 4 calls `pause`; line 5 keeps, in a string, a
    child script whose loop calls `pause`."""
    child = ast.For(
        ast.Name("_", ast.Store()),
        ast.Call(ast.Name("range"), [ast.Constant(100)], []),
        [ast.Expr(_call("time", pause, 0.1))],
        [],
    )
    body = [
        ast.Assign(
            [ast.Name("deadline", ast.Store())], ast.BinOp(_call("time", clock), ast.Add(), ast.Constant(120))
        ),
        ast.While(
            ast.UnaryOp(ast.Not(), ast.Call(ast.Name("ready"), [], [])),
            [
                ast.Assert(ast.Compare(_call("time", clock), [ast.Lt()], [ast.Name("deadline")])),
                ast.Expr(_call("time", pause, 0.1)),
            ],
            [],
        ),
        ast.Assign(
            [ast.Name("CHILD", ast.Store())],
            ast.Constant(ast.unparse(ast.fix_missing_locations(ast.Module([child], [])))),
        ),
    ]
    return ast.parse(ast.unparse(ast.fix_missing_locations(ast.Module(body, []))))


@pytest.mark.parametrize(("clock", "pause"), list(itertools.product(sorted(CLOCKS), sorted(PAUSES))))
def test_the_checks_find_a_private_polling_loop(clock, pause):
    tree = _sample(clock, pause)
    assert polling_loops(tree) == [2, 5]  # the loop, and the string that holds one
    assert clock_reads(tree) == [1, 3]  # the deadline set, and the deadline compared


def test_only_the_shared_helper_polls():
    found = [f"{name}:{line}" for name, tree in modules().items() for line in polling_loops(tree)]
    assert found == []


def test_no_test_reads_a_clock_to_wait_or_to_judge_speed():
    found = [f"{name}:{line}" for name, tree in modules().items() for line in clock_reads(tree)]
    assert sorted({f.split(":")[0] for f in found}) == sorted(CLOCK_USERS), found

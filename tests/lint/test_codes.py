"""Every finding code is listed once, in the docstring of the module whose rule emits it, with the
severity it is emitted at: the codes live with their rules (checks/findings.py)."""

from __future__ import annotations

import ast
import re

from tests.utils.servers import ROOT

CHECKS = ROOT / "backend" / "tunedeck" / "checks"
ROW = re.compile(r"^\| ((?:LF|DS|HW)\d{3}) \| (\w+) +\|", re.M)


def emitted(path) -> set[tuple[str, str]]:
    """(code, severity) of every `finding(code=..., severity=...)` call with constant arguments."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "finding"
        ):
            kw = {k.arg: k.value for k in node.keywords}
            assert not node.args, f"{path.name}:{node.lineno}: finding() takes keywords only"
            if isinstance(kw.get("code"), ast.Constant) and isinstance(kw.get("severity"), ast.Constant):
                out.add((kw["code"].value, kw["severity"].value))
    return out


def test_each_code_is_listed_once_beside_the_rule_that_emits_it():
    listed: dict[str, tuple[str, str]] = {}
    for path in sorted(CHECKS.glob("*.py")):
        for code, severity in ROW.findall(ast.get_docstring(ast.parse(path.read_text())) or ""):
            assert code not in listed, f"{code} is listed in {listed[code][0]} and {path.name}"
            listed[code] = (path.name, severity)
    found = []
    for path in sorted(CHECKS.glob("*.py")):
        for code, severity in emitted(path):
            if listed.get(code) != (path.name, severity):
                found.append(f"{path.name} emits {code} ({severity}); listed as {listed.get(code)}")
    assert found == []
    assert len(listed) >= 30  # the families' tables were read at all

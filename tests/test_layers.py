"""Import layering, read from the source: the checks do not lean on the pipeline that runs them, no
module calls another's private names, and routes and services check specs only through submission."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "backend" / "tunedeck"
CHECKS = {"tunedeck.lint", "tunedeck.reach", "tunedeck.estimate"}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(path: Path) -> dict[str, str]:
    """Local name → the tunedeck module or `module.name` it is bound to, at any depth of the file."""
    known = modules()
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tunedeck"):
                    out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tunedeck"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out[a.asname or a.name] = full if full in known else f"{node.module}:{a.name}"
    return out


def imported_modules(path: Path) -> set[str]:
    return {target.split(":")[0] for target in imported(path).values()}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_lint_and_spec_do_not_import_each_other_or_the_pipeline():
    assert not imported_modules(PACKAGE / "lint.py") & {"tunedeck.spec", "tunedeck.submission"}
    assert not imported_modules(PACKAGE / "spec.py") & {"tunedeck.lint", "tunedeck.reach", "tunedeck.submission"}
    for name in ("reach.py", "estimate.py", "presets.py"):
        assert "tunedeck.submission" not in imported_modules(PACKAGE / name), name


def test_no_module_uses_another_modules_private_names():
    known = modules()
    found = []
    for module, path in known.items():
        names = imported(path)
        found += [f"{module}: from {t.split(':')[0]} import {t.split(':')[1]}" for t in names.values()
                  if ":" in t and private(t.split(":")[1])]
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and private(node.attr)
                    and names.get(node.value.id) in known and names[node.value.id] != module):
                found.append(f"{module}:{node.lineno}: {names[node.value.id]}.{node.attr}")
    assert found == []


def test_routes_and_services_check_specs_only_through_the_pipeline():
    for module, path in modules().items():
        if module.startswith(("tunedeck.api.", "tunedeck.services.")):
            assert not imported_modules(path) & CHECKS, module

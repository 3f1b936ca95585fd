"""Import layering, read from the source: each folder of the package imports only the layers below
it, the checks do not lean on the pipeline that runs them, no module calls another's private names,
and routes and services check specs only through submission."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.utils.servers import ROOT

PACKAGE = ROOT / "backend" / "tunedeck"
CHECKS = {"tunedeck.checks.lint", "tunedeck.checks.reach", "tunedeck.checks.estimate"}


# The tree does not change during a run: each file is listed and parsed once (reaches() walks every
# module's imports, and read afresh each time they took half a minute).
@functools.cache
def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def imported(path: Path) -> dict[str, str]:
    """Local name → the tunedeck module or `module.name` it is bound to, at any depth of the file."""
    known = modules()
    out = {}
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tunedeck"):
                    out[a.asname or a.name] = a.name
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("tunedeck")
        ):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out[a.asname or a.name] = full if full in known else f"{node.module}:{a.name}"
    return out


@functools.cache
def imported_modules(path: Path) -> frozenset[str]:
    return frozenset(target.split(":")[0] for target in imported(path).values())


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# The package's layers from the top down, each a folder (or a module at the package's root). A module
# imports its own layer and the layers below it, never one above: the tree reads as the architecture.
LAYERS = [
    ("cli",),  # the command line: talks to the API, or opens the store for `db` and `token`
    ("main",),  # the app factory: wires routes, services and workers
    ("api",),  # thin routes, their guard and auth
    ("scheduling",),  # the scheduler and the executors (local, ray), registered by name
    ("services",),  # what routes and workers call: jobs, ingest, alerting, charts, live, views
    ("checks",),  # the submit pipeline: spec, lint, reach, catalog, estimate, preflight
    ("schemas",),  # what the REST API takes and answers
    ("planning",),  # pure: who starts next, where
    ("store", "migrations"),  # engine, tables, bulk insert; the schema's history
    ("runner",),  # the per-job process: nothing of the server
    ("alerts",),  # pure detectors
    ("telemetry",),  # SMI backends
    ("contract",),  # what server and runner agree on
    ("config", "problems", "tree", "procs", "workers", "data", "__init__"),  # the base everything uses
]


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, names in enumerate(LAYERS) if part in names)


def test_every_module_of_the_package_has_a_layer():
    assert [
        m
        for m in modules()
        if not any(m.split(".")[1:2] == [n] or m == "tunedeck" for g in LAYERS for n in g)
    ] == []


def test_each_folder_imports_only_the_layers_below_it():
    up = []
    for module, path in modules().items():
        for target in imported_modules(path):
            if target in modules() and layer(target) < layer(module):
                up.append(f"{module} imports {target}, a layer above it")
    assert up == []


def test_the_layers_keep_the_named_boundaries():
    """What the map promises in words, as checks of their own (the order above implies them)."""
    rules = {
        "tunedeck.checks": ("tunedeck.services", "tunedeck.scheduling", "tunedeck.api"),
        "tunedeck.planning": ("tunedeck.checks", "tunedeck.services", "tunedeck.store.db"),
        "tunedeck.contract": ("tunedeck.store", "tunedeck.services", "tunedeck.api"),
        "tunedeck.alerts": ("tunedeck.store", "tunedeck.services", "tunedeck.api"),
    }
    found = [
        f"{module} reaches {sorted(under(reaches(module), *banned))}"
        for module in modules()
        for folder, banned in rules.items()
        if under({module}, folder) and under(reaches(module), *banned)
    ]
    assert found == []


def test_lint_and_spec_do_not_import_each_other_or_the_pipeline():
    assert not imported_modules(PACKAGE / "checks" / "lint.py") & {
        "tunedeck.checks.spec",
        "tunedeck.checks.submission",
    }
    assert not imported_modules(PACKAGE / "checks" / "spec.py") & {
        "tunedeck.checks.lint",
        "tunedeck.checks.reach",
        "tunedeck.checks.submission",
    }
    for name in ("reach.py", "estimate.py", "presets.py"):
        assert "tunedeck.checks.submission" not in imported_modules(PACKAGE / "checks" / name), name


def test_no_module_uses_another_modules_private_names():
    known = modules()
    found = []
    for module, path in known.items():
        names = imported(path)
        found += [
            f"{module}: from {t.split(':')[0]} import {t.split(':')[1]}"
            for t in names.values()
            if ":" in t and private(t.split(":")[1])
        ]
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and private(node.attr)
                and names.get(node.value.id) in known
                and names[node.value.id] != module
            ):
                found.append(f"{module}:{node.lineno}: {names[node.value.id]}.{node.attr}")
    assert found == []


def test_routes_and_services_check_specs_only_through_the_pipeline():
    for module, path in modules().items():
        if module.startswith(("tunedeck.api.", "tunedeck.services.")):
            assert not imported_modules(path) & CHECKS, module


def test_the_routes_define_no_api_shape_of_their_own():
    """Every request body, query model and answer is a class of schemas.py: no route module derives one
    from pydantic's BaseModel, a Strict or JobSpec, or any class that schemas.py defines."""
    shapes = {"BaseModel", "RootModel", "Strict", "JobSpec"} | {
        node.name
        for node in ast.parse((PACKAGE / "schemas.py").read_text()).body
        if isinstance(node, ast.ClassDef)
    }
    found = [
        f"{path.name}:{node.lineno}: {node.name}({base})"
        for path in sorted((PACKAGE / "api").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for base in (b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases)
        if base in shapes
    ]
    assert found == []


def reaches(module: str) -> set[str]:
    """Every tunedeck module that importing `module` runs: its imports, theirs, and their packages."""
    known = modules()
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen or name not in known:
            continue
        seen.add(name)
        todo += imported_modules(known[name])
        todo += [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]  # parent packages
    return seen


def under(names: set[str], *packages: str) -> set[str]:
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in packages)}


SERVER = (
    "tunedeck.api",
    "tunedeck.services",
    "tunedeck.scheduling.scheduler",
    "tunedeck.main",
    "tunedeck.scheduling.executors",
)


def test_the_server_runs_no_runner_code():
    for module in modules():
        if under({module}, *SERVER):
            assert not under(reaches(module), "tunedeck.runner"), module


def test_the_alert_package_reaches_no_service_or_route():
    for module in modules():
        if under({module}, "tunedeck.alerts"):
            assert not under(reaches(module), "tunedeck.services", "tunedeck.api"), module


def test_the_runner_imports_nothing_of_the_server():
    for module in modules():
        if under({module}, "tunedeck.runner"):
            assert not under(reaches(module), *SERVER, "tunedeck.store", "tunedeck.schemas"), module


def test_the_metric_columns_are_listed_once():
    """lflog.METRICS is the list: no other module, nor a page script, spells most of it out again
    (migrations are history and keep theirs)."""
    from tunedeck.contract.lflog import METRICS

    def listing(names: list[str]) -> bool:
        return len(set(names) & set(METRICS)) > len(METRICS) // 2

    found = []
    for module, path in modules().items():
        if module == "tunedeck.contract.lflog" or module.startswith("tunedeck.migrations"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = re.findall(r"\w+", node.value)  # an SQL column list
            else:
                continue
            if listing(names):
                found.append(f"{module}:{node.lineno}")
    for script in sorted((ROOT / "frontend").rglob("*.js")):
        for n, text in enumerate(script.read_text().splitlines(), start=1):
            if listing(re.findall(r"[\"'](\w+)[\"']", text)):
                found.append(f"{script.name}:{n}")
    assert found == []


TRAINING = {"torch", "transformers", "llamafactory", "deepspeed", "peft", "trl", "accelerate"}
TRAINER = ROOT / "trainer" / "tunedeck_train"


def training_imports(path: Path) -> list[str]:
    """Training packages the file imports, at module level or inside any function, as `line: name`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in TRAINING]
    return found


def test_nothing_under_tunedeck_imports_a_training_package():
    """Server, runner and CLI all live under tunedeck; the trainer's own code is tunedeck_train."""
    found = [f"{module}:{hit}" for module, path in modules().items() for hit in training_imports(path)]
    assert found == []


def test_the_trainer_package_may_import_training_packages_but_nothing_of_tunedeck():
    """It runs in the trainer's Python, which need not have the server's dependencies."""
    # The scan sees imports inside functions: lf_train.py has no training import at module level.
    assert {h.split(": ")[1].split(".")[0] for h in training_imports(TRAINER / "lf_train.py")} >= {
        "transformers",
        "llamafactory",
    }
    found = []
    for path in sorted(TRAINER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = ["." if node.level else node.module or ""]
            found += [
                f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0] in ("tunedeck", ".")
            ]
    assert found == []


def test_every_public_service_is_used_in_the_package():
    """A service function or class nothing of tunedeck names is dead code (routes are not services)."""
    used = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used |= {a.name for a in node.names}
    dead = [
        f"{module}.{node.name}"
        for module, path in modules().items()
        if module.startswith("tunedeck.services.")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        and not private(node.name)
        and node.name not in used
    ]
    assert dead == []


def test_a_stored_train_yaml_is_parsed_in_one_place():
    """Job.config() reads the train.yaml that ran; nothing else parses the column on its own."""
    parsers = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, text in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"yaml\.\w*load\w*\([^)]*train_yaml", text)
    ]
    assert len(parsers) == 1 and parsers[0].startswith("store/tables.py:"), parsers

#!/usr/bin/env python
"""Capture the keys of DeepSpeed's config sections, for tunedeck's DeepSpeed lint and path checks.

Run with the *training* environment's python (the one DeepSpeed is installed in)::

    .venv/bin/python scripts/capture_ds_keys.py [--output PATH]

It reads the pydantic models in ``deepspeed/runtime/zero/config.py`` (``DeepSpeedZeroConfig``) and
``offload_config.py`` (the ``offload_param`` / ``offload_optimizer`` sub-models). All of them are
``extra="forbid"``: a key not listed here makes DeepSpeed refuse the file, unless its value is
``"auto"`` (``DeepSpeedConfigModel.__init__`` drops those first, silently). It also reads the
monitor models (``deepspeed/monitor/config.py``: tensorboard, wandb, csv_monitor, comet) and the
sections DeepSpeed still reads key by key from constants (``flops_profiler``, ``autotuning``):
tunedeck needs their names to find the keys that take a path or report to a service. Each field of
a pydantic model keeps its attribute docstring as ``help`` (DeepSpeed documents its fields that
way): tunedeck reads from it whether DeepSpeed writes to a path or makes a folder inside another
key's (``job_name``); the constant sections have no such text, so their help is empty. Writes
``backend/tunedeck/data/deepspeed_keys.json``::

    {"deepspeed_version": "...",
     "models": {"zero_optimization" | "offload_param" | ... | "flops_profiler":
                {field: {"alias": str | null, "type": "bool|int|float|str|enum|dict|any",
                         "choices": [...] | null, "default": <JSON> | null,
                         "deprecated": bool, "new_param": str | null, "help": str}}},
     "locations": {model: "dotted.path.in.the.json"},
     "monitors": [the sections DeepSpeedMonitorConfig reads from the top level]}

The server reads only this file; it never imports deepspeed.
"""

from __future__ import annotations

import argparse
import ast
import enum
import inspect
import json
import pathlib
import types
import typing

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "backend" / "tunedeck" / "data" / "deepspeed_keys.json"
HELP_CHARS = 200  # as capture_lf_args.py keeps LLaMA-Factory's


def _kind(annotation) -> tuple[str, list | None]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _kind(args[0])
        return "any", None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "enum", [m.value for m in annotation]
    if annotation is bool:
        return "bool", None
    if isinstance(annotation, type) and issubclass(annotation, int):
        return "int", None
    if annotation is float:
        return "float", None
    if annotation is str:
        return "str", None
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return "dict", None
    if typing.get_origin(annotation) is dict or annotation is dict:
        return "dict", None
    return "any", None


def _json(value):
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # pp_int → plain int
    return value


def docstrings(model) -> dict[str, str]:
    """Attribute docstrings (`field: T = x` followed by a string) of a model and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())  # installed code, not user input
        except (OSError, TypeError, SyntaxError):
            continue  # builtins and pydantic's own bases
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, doc in zip(body, body[1:]):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                out[field.target.id] = " ".join(doc.value.value.split())[:HELP_CHARS]
    return out


def fields_of(model) -> dict:
    out = {}
    helps = docstrings(model)
    for name, info in sorted(model.model_fields.items()):
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        kind, choices = _kind(info.annotation)
        default = None if info.is_required() or info.default_factory is not None else _json(info.default)
        out[name] = {
            "alias": info.alias,
            "type": kind,
            "choices": choices,
            "default": default,
            "deprecated": bool(extra.get("deprecated", False)),
            "new_param": extra.get("new_param") or None,
            "help": helps.get(name, ""),
        }
    return out


def constant_fields(module, section: str) -> dict:
    """Keys of a section DeepSpeed reads with get_scalar_param: `<SECTION>_<X> = "key"` constants
    that have a `<SECTION>_<X>_DEFAULT` next to them (the others name values, not keys)."""
    consts = vars(module)
    out = {}
    for name, key in sorted(consts.items()):
        default_name = f"{name}_DEFAULT"
        if not (name.startswith(f"{section}_") and isinstance(key, str) and default_name in consts):
            continue
        default = _json(consts[default_name])
        kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(default), "any")
        out[key] = {
            "alias": None,
            "type": kind,
            "choices": None,
            "default": default,
            "deprecated": False,
            "new_param": None,
            "help": "",  # constants carry no text
        }
    return dict(sorted(out.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    import deepspeed
    from deepspeed.autotuning import constants as autotuning
    from deepspeed.monitor.config import DeepSpeedMonitorConfig
    from deepspeed.profiling import constants as flops_profiler
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    monitors = list(DeepSpeedMonitorConfig.model_fields)
    models = {
        "zero_optimization": fields_of(DeepSpeedZeroConfig),
        "offload_param": fields_of(DeepSpeedZeroOffloadParamConfig),
        "offload_optimizer": fields_of(DeepSpeedZeroOffloadOptimizerConfig),
        **{m: fields_of(DeepSpeedMonitorConfig.model_fields[m].annotation) for m in monitors},
        "flops_profiler": constant_fields(flops_profiler, "FLOPS_PROFILER"),
        "autotuning": constant_fields(autotuning, "AUTOTUNING"),
    }
    locations = {m: m for m in models}
    locations.update(
        offload_param="zero_optimization.offload_param",
        offload_optimizer="zero_optimization.offload_optimizer",
    )
    table = {
        "deepspeed_version": deepspeed.__version__,
        "models": models,
        "locations": locations,
        "monitors": monitors,
    }
    args.output.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    n = sum(len(m) for m in table["models"].values())
    print(f"wrote {n} keys of deepspeed {deepspeed.__version__} to {args.output}")


if __name__ == "__main__":
    main()

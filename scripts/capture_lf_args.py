#!/usr/bin/env python
"""Capture the YAML keys `llamafactory-cli train` accepts, for tunedeck's config checks.

Run with the *training* environment's python (the one LLaMA-Factory is installed in)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/capture_lf_args.py [--output PATH]

It imports ``llamafactory.hparams.parser._TRAIN_ARGS`` (the dataclasses that HfArgumentParser fills
from a train YAML via ``parse_dict``) and writes ``backend/tunedeck/data/llamafactory_args.json``::

    {"llamafactory_version": "...", "transformers_version": "...",
     "args": {name: {"type": "bool|int|float|str|list|dict|enum|any", "choices": [...] | null,
                     "default": <JSON value> | null, "group": "<dataclass>", "help": "..."}},
     "removed": {name: "reason"},
     "weights": [{"pickled": "pytorch_model.bin", "safe": "model.safetensors"}, ...]}

``args`` holds only fields with ``init=True`` (``parse_dict`` ignores the others, so they are not
settable from YAML) and is sorted by name. ``type`` comes from the field's annotation:
``Optional``/``Union`` members are reduced, ``Literal`` and ``Enum`` give ``enum`` with choices
(an ``Enum | str`` union too: transformers converts the string to the Enum and rejects others),
``list``/``tuple``/``set`` give ``list``, ``dict`` gives ``dict``; a union of a container and
``str`` keeps the container (the string is a shorthand form); anything else mixed is ``any``.
``choices`` also carries ``metadata["choices"]`` when a field declares it.

``weights`` pairs the weight files that the loaders LLaMA-Factory calls read with ``torch.load``
(an unpickler) with the safetensors file each prefers when both are there: transformers' model,
PEFT's adapter and LLaMA-Factory's value head, as ``llamafactory.extras.constants`` names them
(``X_WEIGHTS_NAME`` beside its ``SAFE_`` spelling).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import enum
import inspect
import json
import math
import os
import pathlib
import re
import sys
import types
import typing
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "backend" / "tunedeck" / "data" / "llamafactory_args.json"
HELP_CHARS = 200

# Keys that train YAMLs written for older LLaMA-Factory / transformers still carry, and that the
# captured version rejects as unknown ("Some keys are not used by the HfArgumentParser").
# Only those absent from the captured args are written out.
KNOWN_REMOVED: dict[str, str] = {
    # LLaMA-Factory's RayArguments before 0.9.5 (src/llamafactory/hparams/training_args.py); 0.9.5
    # keeps only ray_num_workers, ray_init_kwargs, master_addr and master_port.
    "ray_run_name": "Ray run naming was dropped from RayArguments in 0.9.5",
    "ray_storage_path": "Ray result storage was dropped from RayArguments in 0.9.5; results go to output_dir",
    "ray_storage_filesystem": "Ray s3/gs/gcs storage was dropped from RayArguments in 0.9.5",
    "resources_per_worker": "dropped from RayArguments in 0.9.5; each Ray worker reserves 10 CPUs and 1 GPU",
    "placement_strategy": "Ray placement strategy was dropped from RayArguments in 0.9.5",
    # transformers TrainingArguments fields that the captured transformers no longer has.
    "evaluation_strategy": "transformers dropped this TrainingArguments field; use eval_strategy",
    "no_cuda": "transformers dropped this TrainingArguments field; use use_cpu",
    "use_mps_device": "transformers dropped this TrainingArguments field; MPS is used automatically",
    "per_gpu_train_batch_size": "transformers dropped this field; use per_device_train_batch_size",
    "per_gpu_eval_batch_size": "transformers dropped this field; use per_device_eval_batch_size",
    "fp16_backend": "transformers dropped this TrainingArguments field; use half_precision_backend",
    "push_to_hub_token": "transformers dropped this TrainingArguments field; use hub_token",
}

_PRIMITIVES = {bool: "bool", int: "int", float: "float", str: "str"}
_CONTAINERS = {
    list: "list",
    tuple: "list",
    set: "list",
    frozenset: "list",
    dict: "dict",
}


# --------------------------------------------------------------------------------------------------
# Type annotation -> (kind, choices)
# --------------------------------------------------------------------------------------------------


def _resolve_hints(cls: type) -> dict[str, Any]:
    """Field annotations with strings evaluated where possible (``from __future__`` modules)."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            hints.update(typing.get_type_hints(klass))
            continue
        except (NameError, TypeError, AttributeError, SyntaxError):
            pass  # some annotation names are not importable here: evaluate field by field
        module = sys.modules.get(klass.__module__)
        namespace = dict(vars(typing))
        namespace.update(vars(builtins))
        if module is not None:
            namespace.update(vars(module))
        for name, ann in inspect.get_annotations(klass).items():
            if isinstance(ann, str):
                with contextlib.suppress(NameError, TypeError, AttributeError, SyntaxError):
                    ann = eval(ann, namespace)  # annotations of installed code, not user input
            hints[name] = ann  # a string left here goes to _classify_string
    return hints


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType)


def _json_value(value: Any) -> Any:
    """A JSON-able version of a default/choice, or None when there is none."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_json_value(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return None


def _classify(tp: Any) -> tuple[str, list | None]:
    if isinstance(tp, str):
        return _classify_string(tp)
    if tp is typing.Any or tp is None or tp is type(None):
        return "any", None

    if _is_union(tp):
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if not members:
            return "any", None
        if len(members) == 1:
            return _classify(members[0])
        classified = [_classify(m) for m in members]
        kinds = {k for k, _ in classified}
        # Enum/Literal together with plain str: the string must be one of the values.
        # (A Literal next to a str that is not the enum's value space, e.g. `str | Literal[False]`,
        # stays a free string.)
        enum_members = [m for m in members if _is_enum_like(m)]
        others = [m for m in members if not _is_enum_like(m)]
        if enum_members and all(m is str for m in others):
            if any(isinstance(m, type) and issubclass(m, enum.Enum) for m in enum_members) or not others:
                choices: list = []
                for m in enum_members:
                    for c in _classify(m)[1] or []:
                        if c not in choices:
                            choices.append(c)
                return "enum", choices
            return "str", None
        if len(kinds) == 1:
            kind = kinds.pop()
            if kind == "enum":
                return "enum", [c for _, cs in classified for c in (cs or [])]
            return kind, None
        if kinds == {"int", "float"}:
            return "float", None
        for container in ("list", "dict"):
            if kinds - {"str", "enum"} == {container}:
                return container, None
        return "any", None

    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "enum", [_json_value(v) for v in typing.get_args(tp)]
    if origin is not None:
        if origin in _CONTAINERS:
            return _CONTAINERS[origin], None
        if isinstance(origin, type) and issubclass(origin, typing.Mapping):
            return "dict", None
        if isinstance(origin, type) and issubclass(origin, (typing.Sequence, typing.AbstractSet)):
            return "list", None
        return "any", None

    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return "enum", [_json_value(m) for m in tp]
        for base, kind in _PRIMITIVES.items():  # bool before int: bool is an int subclass
            if tp is base:
                return kind, None
        if tp in _CONTAINERS:
            return _CONTAINERS[tp], None
        if issubclass(tp, os.PathLike) or issubclass(tp, pathlib.PurePath):
            return "str", None
        for base, kind in _PRIMITIVES.items():
            if issubclass(tp, base):
                return kind, None
    return "any", None


def _is_enum_like(tp: Any) -> bool:
    return typing.get_origin(tp) is typing.Literal or (isinstance(tp, type) and issubclass(tp, enum.Enum))


_STRING_NAMES = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "list": "list",
    "List": "list",
    "tuple": "list",
    "Tuple": "list",
    "set": "list",
    "Set": "list",
    "Sequence": "list",
    "dict": "dict",
    "Dict": "dict",
    "Mapping": "dict",
}


def _classify_string(text: str) -> tuple[str, list | None]:
    """Last resort for annotations that could not be evaluated: read the string itself."""
    text = text.strip()
    optional = re.fullmatch(r"(?:typing\.)?Optional\[(.*)\]", text)
    if optional:
        return _classify_string(optional.group(1))
    union = re.fullmatch(r"(?:typing\.)?Union\[(.*)\]", text)
    parts = _split_top_level(union.group(1), ",") if union else _split_top_level(text, "|")
    parts = [p.strip() for p in parts if p.strip() not in ("None", "NoneType")]
    if len(parts) > 1:
        kinds = {_classify_string(p)[0] for p in parts}
        if len(kinds) == 1:
            return kinds.pop(), None
        if kinds == {"int", "float"}:
            return "float", None
        for container in ("list", "dict"):
            if kinds - {"str"} == {container}:
                return container, None
        return "any", None
    if not parts:
        return "any", None
    part = parts[0]
    literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", part)
    if literal:
        import ast

        try:
            values = ast.literal_eval("[" + literal.group(1) + "]")
            return "enum", [_json_value(v) for v in values]
        except (ValueError, SyntaxError):
            return "enum", None
    head = re.split(r"[\[.]", part.replace("typing.", ""), maxsplit=1)[0]
    return _STRING_NAMES.get(head, "any"), None


def _split_top_level(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


# --------------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------------


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return _json_value(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _json_value(field.default_factory())
    return None


def _help(field: dataclasses.Field) -> str:
    text = " ".join(str(field.metadata.get("help", "")).split())
    return text[:HELP_CHARS]


PICKLED = (".bin", ".bin.index.json")  # torch.save's files, as the loaders name them (an index names shards)


def weights(constants: Any) -> list[dict[str, str]]:
    """Each pickled weights file name with the safetensors name its loader takes first."""
    names = {k: v for k, v in vars(constants).items() if "WEIGHTS" in k and isinstance(v, str)}
    safe = {k.replace("SAFE_", ""): v for k, v in names.items() if "SAFE_" in k}
    pairs = [{"pickled": v, "safe": safe[k]} for k, v in names.items() if v.endswith(PICKLED) and k in safe]
    return sorted(pairs, key=lambda p: p["pickled"])


def capture() -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import llamafactory
    import transformers
    from llamafactory.extras import constants
    from llamafactory.hparams.parser import _TRAIN_ARGS

    args: dict[str, dict[str, Any]] = {}
    for cls in _TRAIN_ARGS:
        hints = _resolve_hints(cls)
        for field in dataclasses.fields(cls):
            if not field.init:
                continue  # HfArgumentParser.parse_dict never passes these from YAML
            if field.name in args:
                # parse_dict hands such a key to every dataclass that has it; keep the first group.
                continue
            kind, choices = _classify(hints.get(field.name, field.type))
            meta_choices = field.metadata.get("choices")
            if meta_choices is not None:
                choices = [_json_value(c) for c in meta_choices]
            args[field.name] = {
                "type": kind,
                "choices": choices,
                "default": _default(field),
                "group": cls.__name__,
                "help": _help(field),
            }

    removed = {k: v for k, v in sorted(KNOWN_REMOVED.items()) if k not in args}
    still_there = sorted(set(KNOWN_REMOVED) - set(removed))
    if still_there:
        print(f"note: not listed as removed, still accepted: {still_there}", file=sys.stderr)

    return {
        "llamafactory_version": getattr(llamafactory, "__version__", None) or _dist_version("llamafactory"),
        "transformers_version": transformers.__version__,
        "args": {name: args[name] for name in sorted(args)},
        "removed": removed,
        "weights": weights(constants),
    }


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUTPUT)
    opts = parser.parse_args(argv)

    data = capture()
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    init = opts.output.parent / "__init__.py"
    if opts.output == DEFAULT_OUTPUT and not init.exists():
        init.touch()
    tmp = opts.output.with_suffix(opts.output.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, opts.output)

    kinds: dict[str, int] = {}
    for spec in data["args"].values():
        kinds[spec["type"]] = kinds.get(spec["type"], 0) + 1
    print(
        json.dumps(
            {
                "output": str(opts.output),
                "llamafactory_version": data["llamafactory_version"],
                "transformers_version": data["transformers_version"],
                "args": len(data["args"]),
                "types": dict(sorted(kinds.items())),
                "removed": sorted(data["removed"]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

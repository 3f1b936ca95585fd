"""The upstream key tables, captured from the installed packages and shipped as data: LLaMA-Factory's
train arguments (scripts/capture_lf_args.py), its templates (scripts/capture_lf_templates.py) and
DeepSpeed's config models (scripts/capture_ds_keys.py). Every rule that asks which keys exist, what
type they take or which take a path reads them here; the server never imports either package."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache
def lf_table() -> dict[str, Any]:
    return json.loads(resources.files("tunedeck.data").joinpath("llamafactory_args.json").read_text())


@lru_cache
def template_table() -> dict[str, Any]:
    """Template names (scripts/capture_lf_templates.py) and, kept by hand, config.json model_type and
    architectures → the templates that fit, best first. Only families whose template is unambiguous:
    a "llama" config may be Llama 2, 3 or a fine-tune with its own format."""
    return json.loads(resources.files("tunedeck.data").joinpath("llamafactory_templates.json").read_text())


def fitting_templates(model_config: dict[str, Any] | None) -> list[str]:
    """The templates that fit a model's config.json (model_type, else architectures), best first."""
    if not isinstance(model_config, dict):
        return []
    table = template_table()
    found = table["model_types"].get(str(model_config.get("model_type")))
    if found:
        return list(found)
    for arch in model_config.get("architectures") or []:
        if isinstance(arch, str) and arch in table["architectures"]:
            return list(table["architectures"][arch])
    return []


@lru_cache
def ds_table() -> dict[str, Any]:
    return json.loads(resources.files("tunedeck.data").joinpath("deepspeed_keys.json").read_text())

"""The presets shipped in the package's configs/: job YAMLs and DeepSpeed JSONs, keyed by file stem."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CONFIGS_DIR = Path(str(resources.files("tunedeck.configs")))


def presets() -> dict[str, Path]:
    """`*.yaml` are job configs, `*.json` DeepSpeed configs."""
    return {p.stem: p for p in sorted(CONFIGS_DIR.glob("*")) if p.suffix in (".yaml", ".yml", ".json")}


def deepspeed_presets() -> dict[str, Path]:
    return {k: p for k, p in presets().items() if p.suffix == ".json"}

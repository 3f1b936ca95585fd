"""Job spec → the exact LLaMA-Factory `train.yaml` and DeepSpeed `ds_config.json` that run.

Validation happens here, before anything starts: LLaMA-Factory rejects unknown keys only after
6–8 s of imports, and a wrong path fails even later. The argument names come from a data file
captured from the installed LLaMA-Factory (scripts/capture_lf_args.py), so the server never
imports it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunedeck import lint
from tunedeck.config import Settings
from tunedeck.models import JobSpec

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

# Keys tunedeck owns: the job gets a fresh output folder and a token count (throughput).
FORCED = {"overwrite_output_dir": True, "include_num_input_tokens_seen": True}
DEFAULTS = {"do_train": True, "report_to": "none"}
# Path-valued keys that may also name a model on the hub (left as-is when they do).
HUB_OR_PATH_KEYS = ("model_name_or_path", "adapter_name_or_path", "ref_model", "reward_model")
# Path-valued keys that are always local paths.
PATH_KEYS = ("dataset_dir", "media_dir", "cache_dir", "tokenized_path", "logging_dir", "resume_from_checkpoint")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
MAX_YAML_BYTES = 1_000_000


class SpecError(Exception):
    """A spec that cannot run; `errors` are `{"loc": [...], "msg": str}` like FastAPI's own."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def _err(loc: list[Any], msg: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": "value_error"}


def presets() -> dict[str, Path]:
    """Presets in configs/: `*.yaml` are job configs, `*.json` DeepSpeed configs; keyed by file stem."""
    return {p.stem: p for p in sorted(CONFIGS_DIR.glob("*")) if p.suffix in (".yaml", ".yml", ".json")}


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases (no "billion laughs") and with a nesting limit."""

    max_depth = 32

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases (*name) are not accepted in job configs")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.max_depth:
                raise yaml.YAMLError(f"YAML nested deeper than {self.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str) -> dict[str, Any]:
    if len(text.encode()) > MAX_YAML_BYTES:
        raise SpecError([_err(["config"], f"YAML is larger than {MAX_YAML_BYTES} bytes")])
    try:
        data = yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as e:
        raise SpecError([_err(["config"], f"not valid YAML: {e}")]) from None
    if not isinstance(data, dict):
        raise SpecError([_err(["config"], "a LLaMA-Factory train YAML must be a mapping of keys")])
    # `1: x` or `null: x` parse as non-string keys, which no train argument is named.
    if bad := [k for k in data if not isinstance(k, str)]:
        raise SpecError([_err(["config", str(k)], f"key {k!r} is not a name: train keys are strings")
                         for k in bad])
    return data


def spec_from_yaml(text: str, *, name: str, gpus: int | None = None) -> JobSpec:
    """A LLaMA-Factory train YAML as-is: its `deepspeed:` path becomes the job's DeepSpeed config."""
    config = load_yaml(text)
    ds = config.pop("deepspeed", None)
    return JobSpec(name=name, config=config, deepspeed=ds, gpus=gpus)


@dataclass
class Prepared:
    config: dict[str, Any]
    ds_config: dict[str, Any] | None
    gpus: int
    warnings: list[str] = field(default_factory=list)

    def render(self, *, output_dir: Path, ds_path: Path) -> tuple[str, str | None]:
        """The train.yaml and ds_config.json texts for a job's run folder."""
        config = dict(self.config)
        config["output_dir"] = str(output_dir)
        if self.ds_config is not None:
            config["deepspeed"] = str(ds_path)
        train_yaml = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
        ds = None if self.ds_config is None else json.dumps(self.ds_config, indent=2) + "\n"
        return train_yaml, ds


def confine(value: str, settings: Settings) -> Path | None:
    """Resolve a user path against the workspace; None when it falls outside every allowed root."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = settings.workspace / p
    p = p.resolve()
    return p if any(p == r or p.is_relative_to(r) for r in settings.roots) else None


def _is_pathlike(value: str, settings: Settings) -> bool:
    if not HUB_ID.fullmatch(value) or ".." in value.split("/"):
        return True
    return (settings.workspace / value).exists()  # a relative folder in the workspace wins over the hub


def _resolve_paths(config: dict[str, Any], settings: Settings, errors: list[dict[str, Any]]) -> None:
    for key in HUB_OR_PATH_KEYS + PATH_KEYS:
        value = config.get(key)
        if value is None or (key == "dataset_dir" and value == "ONLINE"):
            continue
        if not isinstance(value, str):
            errors.append(_err(["config", key], f"must be a string; got {type(value).__name__}"))
            continue
        parts = [v.strip() for v in value.split(",")] if key == "adapter_name_or_path" else [value]
        out = []
        for part in parts:
            if key in HUB_OR_PATH_KEYS and not _is_pathlike(part, settings):
                out.append(part)  # a hub id: legal, fetched only where the hub is reachable
                continue
            resolved = confine(part, settings)
            if resolved is None:
                roots = ", ".join(map(str, settings.roots))
                errors.append(_err(["config", key], f"path {part!r} is outside the allowed roots ({roots})"))
                break
            out.append(str(resolved))
        config[key] = ",".join(out)


def _deepspeed(
    value: Any, settings: Settings, errors: list[dict[str, Any]], warnings: list[str]
) -> dict[str, Any] | None:
    """A preset name, a JSON file inside the allowed roots, or an inline object."""
    if value is None or isinstance(value, dict):
        return value
    if not isinstance(value, str):
        errors.append(_err(["deepspeed"], "must be a preset name, a JSON object or null"))
        return None
    ds_presets = {k: p for k, p in presets().items() if p.suffix == ".json"}
    path = ds_presets.get(value)
    if path is None and value.endswith(".json"):
        path = confine(value, settings)
        if (path is None or not path.is_file()) and Path(value).stem in ds_presets:
            # A YAML written for LLaMA-Factory's examples/ names a file we ship as a preset.
            path = ds_presets[Path(value).stem]
            warnings.append(f"deepspeed {value!r} not found in the workspace; using preset {path.stem!r}")
    if path is None or not path.is_file():
        names = ", ".join(ds_presets) or "none"
        errors.append(_err(["deepspeed"], f"{value!r} is neither a DeepSpeed preset ({names}) "
                           "nor a JSON file inside the allowed roots"))
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        errors.append(_err(["deepspeed"], f"{path.name} is not valid JSON: {e}"))
        return None
    if not isinstance(data, dict):
        errors.append(_err(["deepspeed"], f"{path.name} must hold a JSON object"))
        return None
    return data


def prepare(spec: JobSpec, *, settings: Settings, node_gpus: int) -> Prepared:
    """Check a spec against LLaMA-Factory's arguments and the node; raise SpecError listing every problem."""
    errors: list[dict[str, Any]] = []
    warnings: list[str] = []
    config = dict(spec.config)
    ds_value = spec.deepspeed
    if "deepspeed" in config:
        if ds_value is not None:
            errors.append(_err(["config", "deepspeed"], "give the DeepSpeed config once, as the spec's `deepspeed`"))
        ds_value = config.pop("deepspeed")
    if "output_dir" in config:
        warnings.append(f"output_dir {config.pop('output_dir')!r} ignored: every job gets a fresh folder in its run directory")

    # Unknown, removed and mistyped keys: the linter's table is the one source of truth.
    errors += [lint.as_error(f) for f in lint.lint_lf_keys(config) if f["severity"] == "error"]
    for key in ("model_name_or_path", "dataset"):
        if key not in config and not (key == "dataset" and config.get("do_train") is False):
            errors.append(_err(["config", key], "is required"))
    _resolve_paths(config, settings, errors)
    if config.get("dataset_dir") is None:
        config["dataset_dir"] = str(settings.workspace / "data")

    gpus = spec.gpus if spec.gpus is not None else (1 if node_gpus > 0 else 0)
    if gpus > node_gpus:
        errors.append(_err(["gpus"], f"asks for {gpus} GPUs; this node has {node_gpus}"))
    ds_config = _deepspeed(ds_value, settings, errors, warnings)
    if errors:
        raise SpecError(errors)

    config.update(FORCED)
    for key, value in DEFAULTS.items():
        config.setdefault(key, value)
    return Prepared(config=config, ds_config=ds_config, gpus=gpus, warnings=warnings)


def launch_env(*, gpus: int, devices: list[int], deepspeed: bool) -> dict[str, str]:
    """Environment for `llamafactory-cli train` beyond the runner's own (which adds the stop signal)."""
    visible = ",".join(map(str, devices))
    env = {
        "HF_HUB_OFFLINE": "1",
        "RECORD_VRAM": "1",
        # HIP honours CUDA_VISIBLE_DEVICES too; ROCR_VISIBLE_DEVICES alone is refused by Ray.
        "CUDA_VISIBLE_DEVICES": visible,
        "HIP_VISIBLE_DEVICES": visible,
    }
    if deepspeed or gpus > 1:
        env["FORCE_TORCHRUN"] = "1"
        env["NPROC_PER_NODE"] = str(max(gpus, 1))
    return env

"""Job spec → the exact LLaMA-Factory `train.yaml` and DeepSpeed `ds_config.json` that run.

Validation happens here, before anything starts: LLaMA-Factory rejects unknown keys only after
6–8 s of imports, and a wrong path fails even later. The argument names come from a data file
captured from the installed LLaMA-Factory (scripts/capture_lf_args.py), so the server never
imports it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tunedeck import lint, reach, tree
from tunedeck.config import Settings
from tunedeck.reach import HUB_ID, confine  # noqa: F401  (the path rules live in reach; callers use these)
from tunedeck.models import JobSpec

CONFIGS_DIR = Path(resources.files("tunedeck") / "configs")

# Keys tunedeck owns: the job gets a fresh output folder and a token count (throughput).
FORCED = {"overwrite_output_dir": True, "include_num_input_tokens_seen": True}
DEFAULTS = {"do_train": True, "report_to": "none"}
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


class _TooMany(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases (no "billion laughs"), with a nesting limit and, when given, a limit
    on keys and list items that stops the parse as soon as it is passed (a parse costs ~30 µs a node)."""

    max_depth = 32
    max_items: int | None = None

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases (*name) are not accepted in job configs")
        # A mapping's keys come with index None, a sequence's items with their position.
        if self.max_items is not None and parent is not None and (index is None or isinstance(parent, yaml.SequenceNode)):
            self._items = getattr(self, "_items", 0) + 1
            if self._items > self.max_items:
                raise _TooMany(f"more than {self.max_items} keys and list items (TUNEDECK_SPEC_MAX_KEYS)")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.max_depth:
                raise yaml.YAMLError(f"YAML nested deeper than {self.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, *, max_items: int | None = None) -> dict[str, Any]:
    if len(text.encode(errors="replace")) > MAX_YAML_BYTES:
        raise SpecError([_err(["config"], f"YAML is larger than {MAX_YAML_BYTES} bytes")])
    loader = _BoundedLoader(text)
    loader.max_items = max_items
    try:
        data = loader.get_single_data()
    except _TooMany as e:
        raise SpecError([_err(["config"], f"has {e}")]) from None
    except yaml.YAMLError as e:
        raise SpecError([_err(["config"], f"not valid YAML: {e}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError([_err(["config"], "a LLaMA-Factory train YAML must be a mapping of keys")])
    if bad := tree.problems(data, ["config"]):
        raise SpecError([_err(loc, reason) for loc, reason in bad])
    return data


def spec_from_yaml(text: str, *, name: str, gpus: int | None = None, max_items: int | None = None) -> JobSpec:
    """A LLaMA-Factory train YAML as-is: its `deepspeed:` path becomes the job's DeepSpeed config."""
    config = load_yaml(text, max_items=max_items)
    ds = config.pop("deepspeed", None)
    try:
        return JobSpec(name=name, config=config, deepspeed=ds, gpus=gpus)
    except ValidationError as e:  # e.g. `deepspeed: 5`: located at the YAML key, like every other error
        where = {"deepspeed": ("config", "deepspeed"), "name": ("query", "name"), "gpus": ("query", "gpus")}
        msgs: dict[tuple, list[str]] = {}
        for x in e.errors():  # a union's alternatives fail one by one: one message per key
            msgs.setdefault(where.get(str(x["loc"][0]) if x["loc"] else "", ("config",)), []).append(x["msg"])
        raise SpecError([_err(list(loc), " or ".join(m)) for loc, m in msgs.items()]) from None


def bound(config: dict[str, Any], ds: Any, settings: Settings) -> None:
    """Refuse a spec with more keys and list items than any real one has, before linting it."""
    n = tree.count(config) + (tree.count(ds) if isinstance(ds, dict) else 0)
    if n > settings.spec_max_keys:
        raise SpecError([_err(["config"], f"has {n} keys and list items (with its DeepSpeed config); at most "
                              f"{settings.spec_max_keys} are accepted (TUNEDECK_SPEC_MAX_KEYS)")])


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
    config = copy.deepcopy(spec.config)  # paths are rewritten in place: the spec stays as submitted
    ds_value = copy.deepcopy(spec.deepspeed)
    bound(config, ds_value, settings)
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
    gpus = spec.gpus if spec.gpus is not None else (1 if node_gpus > 0 else 0)
    if gpus > node_gpus:
        errors.append(_err(["gpus"], f"asks for {gpus} GPUs; this node has {node_gpus}"))
    ds_config = _deepspeed(ds_value, settings, errors, warnings)
    # Paths, network keys, hub ids and remote code: what the job may reach beyond its run folder.
    checked = reach.check(config, ds_config, settings)
    errors += checked.errors + [lint.as_error(f) for f in checked.findings if f["severity"] == "error"]
    if config.get("dataset_dir") is None:
        config["dataset_dir"] = str(settings.workspace / "data")
    if errors:
        raise SpecError(errors)

    config.update(FORCED)
    for key, value in DEFAULTS.items():
        config.setdefault(key, value)
    return Prepared(config=config, ds_config=ds_config, gpus=gpus, warnings=warnings)


def launch_env(*, gpus: int, devices: list[int], deepspeed: bool, offline: bool = True) -> dict[str, str]:
    """Environment for `llamafactory-cli train` beyond the runner's own (which adds the stop signal)."""
    visible = ",".join(map(str, devices))
    env = {
        "RECORD_VRAM": "1",
        # HIP honours CUDA_VISIBLE_DEVICES too; ROCR_VISIBLE_DEVICES alone is refused by Ray.
        "CUDA_VISIBLE_DEVICES": visible,
        "HIP_VISIBLE_DEVICES": visible,
    }
    if offline:  # unless TUNEDECK_ALLOW_HUB: hub ids were checked against the local cache at submit
        env["HF_HUB_OFFLINE"] = "1"
    if deepspeed or gpus > 1:
        env["FORCE_TORCHRUN"] = "1"
        env["NPROC_PER_NODE"] = str(max(gpus, 1))
    return env

"""One submission pipeline: a job spec resolved once, checked once, rendered into its run folder.

`resolve` reads the DeepSpeed config and the model's config.json once each (through one reader
that every check shares), then runs the key and DeepSpeed lint, the reach rules (paths, network,
hub ids, remote code), the node's checks and the memory estimate on that one object. Lint,
estimate, preview and submit all call it and take what they need from the `Submission`.

Validation happens before anything starts: LLaMA-Factory rejects unknown keys only after 6–8 s of
imports, and a wrong path fails even later. The argument names come from a data file captured from
the installed LLaMA-Factory (scripts/capture_lf_args.py), so the server never imports it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tunedeck import tree
from tunedeck.checks import catalog, hubcache, jobenv, kinds, lint, reach, writes
from tunedeck.checks import estimate as est
from tunedeck.checks.findings import SEVERITIES, Finding, as_error
from tunedeck.checks.presets import deepspeed_presets
from tunedeck.checks.tables import lf_table
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.planning import placement
from tunedeck.problems import SpecError, detail
from tunedeck.schemas import JobSpec

MODEL_LOC = ["config", "model_name_or_path"]


@dataclass(frozen=True)
class Node:
    """What a spec is checked against: the GPUs to schedule on, the node's cached preflight (the
    hardware checks are skipped without one) and its smallest GPU's memory (does the estimate fit)."""

    gpus: int = 0
    preflight: dict[str, Any] | None = None
    device_total_bytes: int | None = None
    # On a Ray cluster: its nodes (`gpus` is then the largest node's), and the check that the nodes
    # that may run a job (gpus, nodes) see the workspace (422 items).
    cluster: tuple[placement.ClusterNode, ...] | None = None
    probe: Callable[[int, int], list[dict[str, Any]]] | None = None
    # The executor's own checks of where a job may run (Slurm: its partition, GPUs and nodes against
    # what the cluster says); None from it: the checks above, against `cluster`.
    check: Callable[[JobSpec, int], list[dict[str, Any]] | None] | None = None


class Reader:
    """The JSON files of one submission, each opened once however many checks look at it."""

    def __init__(self) -> None:
        self._files: dict[Path, Any] = {}

    def __call__(self, path: Path) -> Any:
        if path not in self._files:
            try:
                self._files[path] = reach.read_json(path)
            except (OSError, ValueError) as e:
                self._files[path] = e
        found = self._files[path]
        if isinstance(found, Exception):
            raise found
        return found


class Rendered(NamedTuple):
    train_yaml: str
    ds_config: str | None
    output_dir: Path


@dataclass
class Submission:
    """A spec resolved against the server's settings and the node."""

    config: dict[str, Any]  # as it runs: read paths absolute inside the roots, tunedeck's own keys set
    ds_config: dict[str, Any] | None
    model_config: dict[str, Any] | None  # the model's config.json, when it could be read
    gpus: int
    findings: list[Finding]  # lint, reach and node findings, errors first
    errors: list[dict[str, Any]]  # 422 detail items, one per key (lint's carry their code)
    warnings: list[str]
    estimate: dict[str, Any] | None
    estimate_errors: list[dict[str, Any]]  # 422 detail items saying why there is no estimate
    kind: kinds.Kind = kinds.KINDS["train"]
    # The paths the trainer writes (they read `<run folder>/...` above): placed by render, once the
    # job's run folder is known, inside it or in the job's own folder under the scratch root.
    writes: tuple[writes.Placed, ...] = ()

    @property
    def notes(self) -> list[Finding]:
        """The findings below error: what a created job reports back."""
        return [f for f in self.findings if f["severity"] != "error"]

    def checked(self) -> Submission:
        """This submission when it may run; else the SpecError (422) listing every problem."""
        if self.errors:
            raise SpecError(self.errors)
        return self

    def render(self, *, run_dir: Path) -> tuple[str, str | None]:
        """The train.yaml and ds_config.json texts for a job's run folder."""
        config, ds_config = copy.deepcopy(self.config), copy.deepcopy(self.ds_config)
        for placed in self.writes:
            node: Any = config if placed.loc[0] == "config" else ds_config
            for part in placed.loc[1:-1]:
                node = node[part]
            node[placed.loc[-1]] = str(placed.path(run_dir))
        if key := kinds.output_key(self.kind):
            config[key] = str(runfiles.output_dir(run_dir))
        if ds_config is not None:
            config["deepspeed"] = str(run_dir / runfiles.DS_CONFIG)
        import yaml  # loaded by the first launch or preview, not by every server start

        train_yaml = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
        ds = None if ds_config is None else json.dumps(ds_config, indent=2) + "\n"
        return train_yaml, ds

    def write(self, run_dir: Path) -> Rendered:
        """A fresh run folder holding train.yaml (and ds_config.json); the trainer writes to output/."""
        run_dir.mkdir(parents=True, exist_ok=False)
        for scratch in {p.scratch for p in self.writes if p.scratch is not None}:
            writes.own_scratch(scratch, run_dir)
        train_yaml, ds = self.render(run_dir=run_dir)
        (run_dir / runfiles.TRAIN_YAML).write_text(train_yaml)
        if ds is not None:
            (run_dir / runfiles.DS_CONFIG).write_text(ds)
        return Rendered(train_yaml, ds, runfiles.output_dir(run_dir))


def bound(config: dict[str, Any], ds: Any, settings: Settings) -> None:
    """Refuse a spec with more keys and list items than any real one has, before linting it."""
    n = tree.count(config) + (tree.count(ds) if isinstance(ds, dict) else 0)
    if n > settings.spec_max_keys:
        raise SpecError(
            [
                detail(
                    ["config"],
                    f"has {n} keys and list items (with its DeepSpeed config); at most "
                    f"{settings.spec_max_keys} are accepted (TUNEDECK_SPEC_MAX_KEYS)",
                )
            ]
        )


def _deepspeed(
    value: Any, settings: Settings, read: Reader, errors: list[dict[str, Any]], warnings: list[str]
) -> dict[str, Any] | None:
    """A preset name, a JSON file inside the allowed roots, or an inline object."""
    if value is None or isinstance(value, dict):
        return value
    if not isinstance(value, str):
        errors.append(detail(["deepspeed"], "must be a preset name, a JSON object or null"))
        return None
    ds_presets = deepspeed_presets()
    path = ds_presets.get(value)
    if path is None and value.endswith(".json"):
        path = reach.confine(value, settings)
        if (path is None or not path.is_file()) and Path(value).stem in ds_presets:
            # A YAML written for LLaMA-Factory's examples/ names a file we ship as a preset.
            path = ds_presets[Path(value).stem]
            warnings.append(f"deepspeed {value!r} not found in the workspace; using preset {path.stem!r}")
    if path is not None and path.resolve() in reach.server_files(settings):
        errors.append(
            detail(["deepspeed"], f"{value!r} is one of the server's own files; no key may point at it")
        )
        return None
    if path is None or not path.is_file():
        names = ", ".join(ds_presets) or "none"
        errors.append(
            detail(
                ["deepspeed"],
                f"{value!r} is neither a DeepSpeed preset ({names}) nor a JSON file inside the allowed roots",
            )
        )
        return None
    try:
        data = read(path)
    except (OSError, ValueError) as e:
        errors.append(detail(["deepspeed"], f"{path.name} is not valid JSON: {e}"))
        return None
    if not isinstance(data, dict):
        errors.append(detail(["deepspeed"], f"{path.name} must hold a JSON object"))
        return None
    return data


def _model_config(model: Any, settings: Settings, read: Reader) -> dict[str, Any] | None:
    """config.json of a model folder inside the allowed roots, or of a hub id in the HF cache; a
    folder outside the roots is never read."""
    if not isinstance(model, str) or not model:
        return None
    local = reach.confine(model, settings)
    if local is not None and (local / "config.json").is_file():
        path = local / "config.json"
    elif reach.HUB_ID.fullmatch(model) and (snap := hubcache.snapshot(model)) is not None:
        path = snap / "config.json"
    else:
        return None
    try:
        data = read(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_config(model: Any, settings: Settings) -> dict[str, Any] | None:
    """The model's config.json, read as a submit reads it (for the alert engine: the vocabulary)."""
    return _model_config(model, settings, Reader())


def _estimate(
    config: dict[str, Any],
    ds: dict[str, Any] | None,
    model_config: dict[str, Any] | None,
    model: Any,
    gpus: int,
    nodes: int,
    node: Node,
    settings: Settings,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The memory estimate, or the 422 item saying why there is none."""
    if model_config is None:
        return None, {
            "loc": MODEL_LOC,
            "type": "estimate_error",
            "msg": f"no readable config.json for model {model!r} (a folder inside the allowed "
            "roots, or a hub id already in the HF cache)",
        }
    try:
        return est.estimate(
            model_config=model_config,
            config=config,
            ds=ds,
            gpus=gpus,
            nodes=nodes,
            device_total_bytes=node.device_total_bytes,
            cpu_runtime_bytes=settings.estimate_cpu_runtime_bytes,
        ), None
    except est.EstimateError as e:
        return None, {"loc": MODEL_LOC, "msg": str(e), "type": "estimate_error"}
    except (ArithmeticError, ValueError, TypeError) as e:  # e.g. `cutoff_len: nan`, which lint refuses too
        return None, {"loc": ["config"], "msg": f"its values give no estimate: {e}", "type": "estimate_error"}


def _devices(spec: JobSpec, node: Node, errors: list[dict[str, Any]]) -> int:
    """The GPU count of a spec pinned to `devices` (refused: ids the node lacks, repeats, another count)."""
    devices = spec.devices or []
    missing = sorted({d for d in devices if d >= node.gpus})
    if missing:
        have = f"GPUs 0-{node.gpus - 1}" if node.gpus else "no GPU"
        errors.append(
            detail(["devices"], f"GPU {', '.join(map(str, missing))} not on this node (it has {have})")
        )
    elif len(set(devices)) != len(devices):
        errors.append(detail(["devices"], f"names a GPU twice: {devices}"))
    elif spec.gpus is not None and spec.gpus != len(devices):
        errors.append(
            detail(
                ["devices"],
                f"{len(devices)} GPU(s) {devices} conflict with gpus={spec.gpus}; give one or both equal",
            )
        )
    return len(devices)


def _nodes(spec: JobSpec, gpus: int, node: Node) -> list[dict[str, Any]]:
    """Where a job may run: one node here; on a Ray cluster, nodes that fit it and see the workspace;
    on Slurm, what the executor's own check says."""
    if node.cluster is None:
        if spec.slurm is not None:
            return [detail(["slurm"], "`slurm` is for the slurm executor (TUNEDECK_EXECUTOR=slurm)")]
        if spec.nodes > 1:
            return [detail(["nodes"], f"{spec.nodes} nodes need the ray executor (TUNEDECK_EXECUTOR=ray)")]
        return []
    if spec.devices is not None:
        return [detail(["devices"], "GPU ids are the ray executor's to choose; ask for `gpus` per node")]
    if spec.kind == "chat":  # its proxy reaches the chat server on this host only
        return [detail(["kind"], "chat jobs need the local executor")]
    found = node.check(spec, gpus) if node.check is not None else None
    if found is not None:
        return found
    if spec.slurm is not None:
        return [detail(["slurm"], "`slurm` is for the slurm executor (TUNEDECK_EXECUTOR=slurm)")]
    refused = placement.refusal(gpus, spec.nodes, list(node.cluster))
    if refused or node.probe is None:
        return refused
    return node.probe(gpus, spec.nodes)


def resolve(spec: JobSpec, settings: Settings, node: Node) -> Submission:
    """Read, check and estimate a spec once. Raises SpecError only for a spec too large to check;
    every other problem is in the result's `errors` (`checked()` raises them)."""
    read = Reader()
    config = copy.deepcopy(spec.config)  # paths are rewritten in place: the spec stays as submitted
    ds_value = copy.deepcopy(spec.deepspeed)
    bound(config, ds_value, settings)
    errors: list[dict[str, Any]] = []  # those no finding locates: required keys, the node, the files
    warnings: list[str] = []
    if "deepspeed" in config:
        if ds_value is not None:
            errors.append(
                detail(["config", "deepspeed"], "give the DeepSpeed config once, as the spec's `deepspeed`")
            )
        in_config = config.pop("deepspeed")
        if ds_value is None:
            ds_value = in_config
    kind = kinds.of(spec.kind)
    warnings += kinds.take_owned(kind, config)
    if "output_dir" in config:
        warnings.append(
            f"output_dir {config.pop('output_dir')!r} ignored: every job gets a fresh folder in its run directory"
        )
    gpus = spec.gpus if spec.gpus is not None else (1 if node.gpus > 0 else 0)
    if spec.devices is not None:
        gpus = _devices(spec, node, errors)
    elif node.cluster is None and gpus > node.gpus:
        errors.append(detail(["gpus"], f"asks for {gpus} GPUs; this node has {node.gpus}"))
    errors += _nodes(spec, gpus, node)
    errors += [detail(loc, why) for loc, why in jobenv.problems(spec.env)]

    ds_config = _deepspeed(ds_value, settings, read, errors, warnings)
    if isinstance(ds_value, str):
        bound(config, ds_config, settings)  # a file's keys cost as much to check as inline ones
    model = config.get("model_name_or_path")
    model_config = _model_config(model, settings, read)
    # The server launches without USE_MCA=1: Megatron-Core keys are unknown keys there.
    findings = lint.lint(
        config, ds_config, gpus=gpus, preflight=node.preflight, model_config=model_config, mca=False
    )
    if kind.name == "train":
        estimate, estimate_error = _estimate(
            config, ds_config, model_config, model, gpus, spec.nodes, node, settings
        )
    else:  # the estimator models training memory (optimizer state, gradients, activations)
        estimate, estimate_error = (
            None,
            {
                "loc": ["kind"],
                "msg": f"memory estimates are for train jobs; this is a {kind.name} job",
                "type": "estimate_error",
            },
        )
    kind_errors, kind_warnings = kinds.check(
        kind,
        config,
        args=lf_table()["args"],
        gpus=gpus,
        preflight=node.preflight,
        deepspeed=ds_config is not None,
    )
    errors += kind_errors
    warnings += kind_warnings
    # Paths, network keys, hub ids and remote code: what the job may reach beyond its run folder.
    reached = reach.check(config, ds_config, settings, read=read)
    if not any(x["loc"] == ["config", "dataset_dir"] for x in reached.errors):
        findings += catalog.lint_datasets(config, settings)  # dataset_dir is absolute and inside now
    findings = sorted(findings + reached.findings, key=lambda f: SEVERITIES.index(f["severity"]))

    located = [as_error(f) for f in findings if f["severity"] == "error"]
    seen = {tuple(x["loc"]) for x in located}  # one item per key: the finding's, with its code and fix
    errors = located + [x for x in errors + reached.errors if tuple(x["loc"]) not in seen]
    if estimate_error is not None and estimate_error["loc"] == ["config"] and located:
        estimate_errors = located  # the values it could not use, each at its key
    else:
        estimate_errors = [estimate_error] if estimate_error is not None else []
    if config.get("dataset_dir") is None:
        config["dataset_dir"] = str(settings.workspace / "data")
    kinds.apply(kind, config)
    return Submission(
        config=config,
        ds_config=ds_config,
        model_config=model_config,
        gpus=gpus,
        findings=findings,
        errors=errors,
        warnings=warnings,
        estimate=estimate,
        estimate_errors=estimate_errors,
        kind=kind,
        writes=tuple(reached.writes),
    )


def is_train_key(key: str) -> bool:
    """A key LLaMA-Factory's train command accepts (or `deepspeed`, which the spec carries)."""
    return key == "deepspeed" or key in lf_table()["args"]

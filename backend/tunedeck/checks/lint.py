"""Config lint: what goes wrong before training starts, found before a job takes a GPU.

Every finding is `{"code", "severity", "path", "message", "fix"}` (checks/findings.py); codes are
stable (the UI and scripts may key on them), paths name the key (`config.fp16`,
`deepspeed.zero_optimization.stage3_parition_grads`, `gpus`). The key rules' codes:

| code  | sev     | what                                                                        |
|-------|---------|-----------------------------------------------------------------------------|
| LF001 | error   | key unknown to the installed LLaMA-Factory (it refuses the YAML)            |
| LF002 | error   | key removed in this LLaMA-Factory version (e.g. pre-0.9.5 Ray keys)         |
| LF003 | error   | value of the wrong type / not one of the choices / out of range (RANGES)    |
| LF004 | warning | `template` does not match the model family in the model's config.json       |
| LF005 | error   | fp16 and bf16 both on (transformers refuses)                                |
| LF006 | warning | output_dir already holds a run and overwrite_output_dir is off (resumes)    |
| LF007 | info    | Megatron-Core (USE_MCA=1) YAML: its mcore_adapter keys are not checked      |
| LF008 | info    | not a LLaMA-Factory train YAML (accelerate / v1 / token config): skipped    |
| LF016 | error   | template that this LLaMA-Factory does not define                            |
| LF020 | warning | learning_rate 0, or far outside its finetuning type's usual range           |
| DS001 | error   | key DeepSpeed does not know under zero_optimization (it refuses the file)   |
| DS002 | warning | unknown key whose value is "auto": DeepSpeed drops it silently              |
| DS003 | error   | both spellings of an aliased / renamed key                                  |
| DS004 | warning | deprecated key (DeepSpeed maps it to the new one)                           |
| DS005 | error   | known key with a value of the wrong type or out of range                    |
| DS006 | error   | value contradicting the training arguments (the HF integration raises)      |
| DS007 | info    | overlap_comm keeps ≈4.5× the bucket sizes in memory                         |
| DS008 | info    | ZeRO-3 gathers the full 16-bit model on rank 0 at save time                 |
| DS009 | warning | the job's DeepSpeed file could not be found or read (not checked)           |
| HW001 | warning | fp16 on gfx942 (MI300): bf16 is steadier and as fast                        |
| HW002 | warning | multi-GPU on ROCm without a large ddp_timeout                               |
| HW003 | error   | more GPUs than the node has                                                 |
| HW004 | warning | flash_attn fa2 asked for, flash-attn not importable in the training env     |

The findings' shape and the codes of the other families: checks/findings.py (reach.py lists the
path, network, remote-code and pickle codes, catalog.py the dataset codes).
The LLaMA-Factory and DeepSpeed key tables are data files captured from the installed packages
(scripts/capture_lf_args.py, scripts/capture_ds_keys.py): the server never imports either.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from tunedeck.alerts.advice import FAR_ABOVE, FAR_BELOW, USUAL_LR
from tunedeck.checks import hubcache
from tunedeck.checks.findings import SEVERITIES, Finding, finding
from tunedeck.checks.presets import presets
from tunedeck.checks.tables import ds_table, fitting_templates, lf_table, template_table

# A multi-GPU job on ROCm needs longer than the 1800 s default for process-group start (the seed
# sets 180000000): below this many seconds we warn.
DDP_TIMEOUT_MIN_S = 3600
OVERLAP_FACTOR = 4.5
# "Did you mean" costs ~1 ms a key (difflib against every argument): a body of unknown keys, which
# anyone who may read can send to /api/lint, must not buy seconds of CPU.
SUGGEST_MAX = 50
# Keys that mark a YAML as something other than a `llamafactory-cli train` config (lint_file skips it).
ACCELERATE_KEYS = {"compute_environment", "distributed_type"}
V1_KEYS = {"dist_config", "kernel_config", "model_class", "train_dataset"}
MCA_KEYS = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"}


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def lf_value(config: dict[str, Any], key: str) -> Any:
    """A training argument as LLaMA-Factory will see it: the YAML's value or the captured default."""
    if key in config and config[key] is not None:
        return config[key]
    info = lf_table()["args"].get(key)
    return None if info is None else info.get("default")


# ---------------------------------------------------------------- LLaMA-Factory keys


def _type_problem(value: Any, kind: str, choices: list | None) -> str | None:
    if value is None or kind == "any":
        return None
    if choices and kind == "enum" and str(value) not in [str(c) for c in choices]:
        return f"must be one of {', '.join(map(str, choices))}; got {value!r}"
    bool_text = isinstance(value, str) and value.lower() in ("true", "false")
    if kind == "bool" and not isinstance(value, bool) and not bool_text:
        return f"must be true or false; got {value!r}"
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        whole = isinstance(value, float) and value.is_integer()
        if not whole and not (isinstance(value, str) and re.fullmatch(r"-?\d+", value)):
            return f"must be an integer; got {value!r}"
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        try:
            float(value)
        except (TypeError, ValueError):
            return f"must be a number; got {value!r}"
    if kind == "str" and isinstance(value, (dict, list)):
        return f"must be a string; got {type(value).__name__}"
    if kind == "dict" and not isinstance(value, (dict, str)):
        return f"must be a mapping; got {type(value).__name__}"
    return None


class Span(NamedTuple):
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is refused
    high_open: bool = False
    why: str = ""


INT64 = Span(-(2**63), 2**63 - 1, why="a 64-bit integer")
# Value ranges the table's types cannot say. Each is one that torch, transformers, PEFT or LLaMA-Factory
# enforces only after the job has taken its GPUs and imported for seconds, or never (a NaN learning
# rate trains into NaN). Beyond these, every `int` key must fit 64 bits and every `float` be finite.
RANGES: dict[str, Span] = {
    "learning_rate": Span(0, why="torch's optimizers refuse a negative learning rate"),
    "per_device_train_batch_size": Span(1, why="a batch holds at least one example"),
    "per_device_eval_batch_size": Span(1, why="a batch holds at least one example"),
    "gradient_accumulation_steps": Span(1, why="at least one step per update"),
    "max_steps": Span(-1, why="-1 lets num_train_epochs decide"),
    "num_train_epochs": Span(0),
    "logging_steps": Span(0, low_open=True, why="transformers refuses 0 steps"),
    "save_steps": Span(0, low_open=True, why="transformers refuses 0 steps"),
    "eval_steps": Span(0, low_open=True, why="transformers refuses 0 steps"),
    "warmup_steps": Span(0),
    "warmup_ratio": Span(0, 1, why="a share of the steps"),
    "weight_decay": Span(0, why="torch's optimizers refuse a negative weight decay"),
    "adam_beta1": Span(0, 1, high_open=True, why="torch's Adam needs 0 <= beta < 1"),
    "adam_beta2": Span(0, 1, high_open=True, why="torch's Adam needs 0 <= beta < 1"),
    "adam_epsilon": Span(0, why="torch's Adam refuses a negative epsilon"),
    "max_grad_norm": Span(0, why="0 turns clipping off"),
    "lora_rank": Span(1, why="PEFT needs a positive rank"),
    "lora_dropout": Span(0, 1, why="a dropout probability"),
    "cutoff_len": Span(1),
    "val_size": Span(0),
    "dataloader_num_workers": Span(0, why="torch's DataLoader refuses a negative count"),
    "preprocessing_num_workers": Span(1, why="datasets needs at least one process"),
    "max_samples": Span(1),
    "seed": Span(0, 2**32 - 1, why="numpy seeds are 32-bit"),
    "ddp_timeout": Span(1, 86_399_999_999_999, why="the longest timedelta Python holds"),
}


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:  # YAML 1.1 reads `5e-5` as text; LLaMA-Factory's parser converts it
        return int(value) if re.fullmatch(r"\s*-?\d+\s*", str(value)) else float(value)
    except (TypeError, ValueError):
        return None


def _outside(x: float, span: Span) -> str | None:
    if span.low is not None and (x < span.low or (span.low_open and x == span.low)):
        return f"must be {'above' if span.low_open else 'at least'} {span.low}"
    if span.high is not None and (x > span.high or (span.high_open and x == span.high)):
        return f"must be {'below' if span.high_open else 'at most'} {span.high}"
    return None


def _range_problem(key: str | None, value: Any, kind: str) -> str | None:
    """A number of the right type that the trainer would still refuse or overflow on."""
    if kind not in ("int", "float") or (x := _as_number(value)) is None:
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return f"must be a finite number; got {value!r}"
    spans = ([INT64] if kind == "int" else []) + ([RANGES[key]] if key in RANGES else [])
    for span in spans:
        if problem := _outside(x, span):
            return f"{problem}; got {value!r}" + (f" ({span.why})" if span.why else "")
    return None


def _value_problem(key: str | None, value: Any, kind: str, choices: list | None) -> str | None:
    return _type_problem(value, kind, choices) or _range_problem(key, value, kind)


def lint_lf_keys(config: dict[str, Any], *, mca: bool = False) -> list[Finding]:
    """Unknown, removed and mistyped keys; with `mca` (USE_MCA=1) unknown keys belong to mcore_adapter."""
    table = lf_table()
    known, removed, version = table["args"], table.get("removed", {}), table["llamafactory_version"]
    out = []
    guesses = SUGGEST_MAX
    for key, value in config.items():
        path = f"config.{key}"
        if key in ("deepspeed", "output_dir") or (mca and key not in known and key not in removed):
            continue  # handled by the spec (tunedeck owns both) / mcore_adapter's own arguments
        if key in removed:
            out.append(
                finding(
                    code="LF002",
                    severity="error",
                    path=path,
                    message=f"`{key}` is no longer accepted by LLaMA-Factory {version}: {removed[key]}",
                    fix=f"remove `{key}`",
                )
            )
        elif key not in known:
            guesses -= 1
            close = (
                difflib.get_close_matches(key, known.keys(), n=1) if guesses >= 0 and len(key) <= 80 else []
            )
            fix = f"rename it to `{close[0]}`" if close else f"remove `{key}`"
            if (
                key.startswith("fsdp_") and "fsdp_config" in known
            ):  # transformers 5 dropped the flat fsdp_* args
                fix = f"move it under `fsdp_config` as `{key[len('fsdp_') :]}`"
            out.append(
                finding(
                    code="LF001",
                    severity="error",
                    path=path,
                    message=f"`{key}` is not a LLaMA-Factory {version} argument: "
                    "it stops with 'Some keys are not used by the HfArgumentParser'",
                    fix=fix,
                )
            )
        elif problem := _value_problem(key, value, known[key].get("type", "any"), known[key].get("choices")):
            out.append(
                finding(
                    code="LF003",
                    severity="error",
                    path=path,
                    message=f"`{key}` {problem}",
                    fix=f"give `{key}` a valid value",
                )
            )
    return out


def lint_learning_rate(config: dict[str, Any]) -> list[Finding]:
    """A learning rate far outside its finetuning type's usual range: a warning, as such a run does not
    fail, it trains into noise (loss flat at the uniform guess, zero gradients) or stands still."""
    usual = USUAL_LR.get(str(lf_value(config, "finetuning_type") or "lora"))  # alerts.advice: the ranges
    try:
        lr = float(lf_value(config, "learning_rate"))
    except (TypeError, ValueError):
        return []  # not a number: LF003 says so
    if usual is None or not math.isfinite(lr) or lr < 0:
        return []  # an unknown type: no usual range; NaN, inf and negatives: the range check's errors
    span = f"usually {usual.low:.0e} to {usual.high:.0e} for {usual.what}"
    if lr == 0:
        problem = f"is 0: the weights never change and the run trains nothing ({span})"
    elif lr > usual.high * FAR_ABOVE:
        problem = (
            f"is {lr:.3g}, far above what is {span}: the loss jumps to the uniform guess "
            "(ln of the vocabulary) and the gradients vanish, yet the run ends 'succeeded'"
        )
    elif lr < usual.low / FAR_BELOW:
        problem = f"is {lr:.3g}, far below what is {span}: the run would barely move from the base model"
    else:
        return []
    return [
        finding(
            code="LF020",
            severity="warning",
            path="config.learning_rate",
            message=f"learning_rate {problem}",
            fix=f"set learning_rate within {usual.low:.0e} to {usual.high:.0e}",
        )
    ]


def lint_lf_semantics(
    config: dict[str, Any], *, model_config: dict[str, Any] | None, output_dir: Path | None
) -> list[Finding]:
    out = lint_learning_rate(config)
    if truthy(config.get("fp16")) and truthy(config.get("bf16")):
        out.append(
            finding(
                code="LF005",
                severity="error",
                path="config.bf16",
                message="fp16 and bf16 are both on; transformers "
                "refuses ('At most one of fp16 and bf16 can be True')",
                fix="keep one: bf16 on MI200/MI300 and Ampere or newer, fp16 on older cards",
            )
        )
    template, model_type = config.get("template"), (model_config or {}).get("model_type")
    fits = fitting_templates(model_config)
    known = template_table()["templates"]
    if isinstance(template, str) and known and template not in known:
        near = difflib.get_close_matches(template, known, n=3, cutoff=0.5) if len(template) <= 80 else []
        out.append(
            finding(
                code="LF016",
                severity="error",
                path="config.template",
                message=f"template `{template}` is not one LLaMA-Factory "
                f"{template_table()['llamafactory_version']} defines; the run would fail with "
                f"'Template {template} does not exist.'" + (f" (closest: {', '.join(near)})" if near else ""),
                fix=f"set `template: {(fits or near or ['default'])[0]}`",
            )
        )
    elif isinstance(template, str) and fits and template not in fits and config.get("stage", "sft") != "pt":
        want = " or ".join(fits)
        out.append(
            finding(
                code="LF004",
                severity="warning",
                path="config.template",
                message=f"template `{template}` does not fit the "
                f"model family `{model_type}` (from the model's config.json): the chat format "
                "the model learns will not be the one it was trained on",
                fix=f"set `template: {want}`",
            )
        )
    if (
        output_dir is not None
        and output_dir.is_dir()
        and any(output_dir.iterdir())
        and not truthy(config.get("overwrite_output_dir"))
    ):
        out.append(
            finding(
                code="LF006",
                severity="warning",
                path="config.output_dir",
                message=f"{output_dir} already holds a run: "
                "LLaMA-Factory silently resumes from its last checkpoint and appends to its "
                "trainer_log.jsonl",
                fix="use a fresh output_dir or set `overwrite_output_dir: true`",
            )
        )
    return out


# ---------------------------------------------------------------- DeepSpeed


def _lint_ds_model(section: dict[str, Any], model: str, path: str) -> list[Finding]:
    """Keys of one DeepSpeed pydantic model (extra="forbid", "auto" values dropped first)."""
    fields = ds_table()["models"][model]
    by_alias = {f["alias"]: name for name, f in fields.items() if f["alias"]}
    spellings: dict[str, list[str]] = {}
    out = []
    for key, value in section.items():
        kpath = f"{path}.{key}"
        name = key if key in fields else by_alias.get(key)
        if name is None:
            close = difflib.get_close_matches(key, [*fields, *by_alias], n=1, cutoff=0.7)
            fix = f"rename it to `{close[0]}`" if close else f"remove `{key}`"
            if value == "auto":
                out.append(
                    finding(
                        code="DS002",
                        severity="warning",
                        path=kpath,
                        message=f"`{key}` is not a DeepSpeed "
                        f'{ds_table()["deepspeed_version"]} `{model}` key; with the value "auto" '
                        "DeepSpeed drops it silently, so it has no effect",
                        fix=fix,
                    )
                )
            else:
                out.append(
                    finding(
                        code="DS001",
                        severity="error",
                        path=kpath,
                        message=f"`{key}` is not a DeepSpeed "
                        f"{ds_table()['deepspeed_version']} `{model}` key: DeepSpeed refuses the "
                        "file ('Extra inputs are not permitted')",
                        fix=fix,
                    )
                )
            continue
        # Counted even when "auto": the HF integration fills some "auto" keys before DeepSpeed reads them.
        spellings.setdefault(name, []).append(key)
        if value == "auto":
            continue
        info = fields[name]
        if info["deprecated"]:
            spellings.setdefault(info["new_param"] or name, []).append(key)
            out.append(
                finding(
                    code="DS004",
                    severity="warning",
                    path=kpath,
                    message=f"`{key}` is deprecated in DeepSpeed",
                    fix=f"use `{info['new_param']}`" if info["new_param"] else f"remove `{key}`",
                )
            )
        if name in ("offload_param", "offload_optimizer") and isinstance(value, dict):
            out += _lint_ds_model(value, name, kpath)
            continue
        problem = _value_problem(None, value, info["type"], info["choices"])
        if problem is None and info["type"] == "int" and isinstance(value, (int, float)) and value < 0:
            problem = f"must not be negative; got {value!r}"
        if problem:
            out.append(
                finding(
                    code="DS005",
                    severity="error",
                    path=kpath,
                    message=f"`{key}` {problem}",
                    fix=f"give `{key}` a valid value",
                )
            )
    for name, keys in spellings.items():
        if len(keys) > 1 and name in fields and not fields[name]["deprecated"]:
            out.append(
                finding(
                    code="DS003",
                    severity="error",
                    path=f"{path}.{keys[-1]}",
                    message=f"`{name}` is given twice, as "
                    f"{' and '.join(f'`{k}`' for k in keys)}: DeepSpeed refuses the pair",
                    fix=f"keep only `{keys[0]}`",
                )
            )
    return out


def _ds_get(ds: dict[str, Any], dotted: str) -> Any:
    node: Any = ds
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def number(value: Any) -> float | None:
    """A value as a float (YAML and JSON numbers, numeric text), or None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def lint_ds_vs_training(ds: dict[str, Any], config: dict[str, Any], *, gpus: int | None) -> list[Finding]:
    """What HfTrainerDeepSpeedConfig.trainer_config_process would call a mismatch (it raises)."""
    micro, ga = (
        lf_value(config, "per_device_train_batch_size"),
        lf_value(config, "gradient_accumulation_steps"),
    )
    pairs: list[tuple[str, str, Any]] = [
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", micro),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", ga),
        ("gradient_clipping", "max_grad_norm", lf_value(config, "max_grad_norm")),
        ("optimizer.params.lr", "learning_rate", lf_value(config, "learning_rate")),
        ("optimizer.params.eps", "adam_epsilon", lf_value(config, "adam_epsilon")),
        ("optimizer.params.weight_decay", "weight_decay", lf_value(config, "weight_decay")),
        ("scheduler.params.warmup_max_lr", "learning_rate", lf_value(config, "learning_rate")),
        ("fp16.enabled", "fp16", truthy(lf_value(config, "fp16"))),
        ("bf16.enabled", "bf16", truthy(lf_value(config, "bf16"))),
    ]
    if gpus is not None and (m := number(micro)) is not None and (g := number(ga)) is not None:
        pairs.append(
            (
                "train_batch_size",
                "per_device_train_batch_size × gradient_accumulation_steps × GPUs",
                int(m * g * max(gpus, 1)),
            )
        )
    out = []
    for ds_key, hf_key, hf_val in pairs:
        ds_val = _ds_get(ds, ds_key)
        if ds_val is None or ds_val == "auto" or hf_val is None:
            continue
        same = (truthy(ds_val) == hf_val) if isinstance(hf_val, bool) else (number(ds_val) == number(hf_val))
        if not same:
            out.append(
                finding(
                    code="DS006",
                    severity="error",
                    path=f"deepspeed.{ds_key}",
                    message=f"DeepSpeed `{ds_key}` = {ds_val!r} "
                    f"contradicts the training argument {hf_key} = {hf_val!r}: the HF DeepSpeed "
                    "integration stops with 'Please correct the following DeepSpeed config values "
                    "that mismatch TrainingArguments values'",
                    fix=f'set `{ds_key}` to "auto" (or to {hf_val!r})',
                )
            )
    return out


def lint_ds_memory(ds: dict[str, Any], *, hidden_size: int | None) -> list[Finding]:
    zero = ds.get("zero_optimization")
    if not isinstance(zero, dict):
        return []
    stage = number(zero.get("stage")) or 0
    out = []
    if truthy(zero.get("overlap_comm")):
        # "auto" buckets are filled by the HF integration from the model's hidden size (ZeRO-3).
        auto = {
            "reduce_bucket_size": hidden_size * hidden_size if hidden_size else None,
            "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size) if hidden_size else None,
        }
        keys = (
            ("reduce_bucket_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size")
            if stage >= 3
            else ("reduce_bucket_size", "allgather_bucket_size")
        )
        defaults = {
            "reduce_bucket_size": 5e8,
            "allgather_bucket_size": 5e8,
            "stage3_prefetch_bucket_size": 5e7,
        }
        total, known = 0.0, True
        for k in keys:
            if k == "prefetch_bucket_size" and "stage3_prefetch_bucket_size" in zero:
                continue
            v = zero.get(k, defaults.get(k) if k != "prefetch_bucket_size" else None)
            v = auto.get(k) if v == "auto" else v
            if v is None and k == "prefetch_bucket_size":
                continue
            if (n := number(v)) is None:
                known = False
                continue
            total += n
        cost = (
            f"≈{OVERLAP_FACTOR * total * 2 / 2**30:.1f} GiB (at 2 bytes per element)"
            if known
            else '(bucket sizes are "auto": they follow the model\'s hidden size²)'
        )
        out.append(
            finding(
                code="DS007",
                severity="info",
                path="deepspeed.zero_optimization.overlap_comm",
                message=f"overlap_comm keeps about {OVERLAP_FACTOR}× the bucket sizes in memory: {cost}",
                fix="lower reduce_bucket_size / prefetch bucket, or set overlap_comm false when memory is tight",
            )
        )
    gather = zero.get(
        "stage3_gather_16bit_weights_on_model_save", zero.get("gather_16bit_weights_on_model_save")
    )
    if stage >= 3 and truthy(gather):
        out.append(
            finding(
                code="DS008",
                severity="info",
                path="deepspeed.zero_optimization.stage3_gather_16bit_weights_on_model_save",
                message="ZeRO-3 gathers the whole 16-bit model on rank 0 at every save: a save-time peak of "
                "about 2 bytes × parameters in host memory and one layer at a time on the GPU",
                fix="keep it for a loadable model; for LoRA the adapter is small, for a full fine-tune "
                "make sure rank 0's host RAM holds 2 × parameters, or save ZeRO shards instead",
            )
        )
    return out


def lint_deepspeed(
    ds: Any, config: dict[str, Any] | None = None, *, gpus: int | None = None, hidden_size: int | None = None
) -> list[Finding]:
    if not isinstance(ds, dict):
        return [
            finding(
                code="DS005",
                severity="error",
                path="deepspeed",
                message="a DeepSpeed config must be a JSON object",
                fix="give a JSON object with a zero_optimization section",
            )
        ]
    out = []
    zero = ds.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        out.append(
            finding(
                code="DS005",
                severity="error",
                path="deepspeed.zero_optimization",
                message="must be an object",
                fix="give zero_optimization as an object",
            )
        )
    elif isinstance(zero, dict):
        out += _lint_ds_model(zero, "zero_optimization", "deepspeed.zero_optimization")
    if config is not None:
        out += lint_ds_vs_training(ds, config, gpus=gpus)
    return out + lint_ds_memory(ds, hidden_size=hidden_size)


# ---------------------------------------------------------------- hardware (from a preflight)


def lint_hardware(
    config: dict[str, Any], ds: dict[str, Any] | None, *, gpus: int | None, preflight: dict[str, Any] | None
) -> list[Finding]:
    """Checks that need the node: its arch, GPU count, libraries. Silent without a preflight."""
    if not preflight:
        return []
    out = []
    node_gpus = len(preflight.get("devices") or [])
    archs = {str(d.get("arch", "")).split(":")[0] for d in preflight.get("devices") or []}
    rocm = preflight.get("backend") == "rocm"
    fp16 = truthy(config.get("fp16")) or truthy(_ds_get(ds or {}, "fp16.enabled"))
    if fp16 and "gfx942" in archs:
        out.append(
            finding(
                code="HW001",
                severity="warning",
                path="config.fp16",
                message="fp16 on gfx942 (MI300): its loss scaling can "
                "overflow and skip steps, while bf16 runs at the same speed with fp32's range",
                fix='set `bf16: true` and remove `fp16` (and set the DeepSpeed fp16.enabled to "auto")',
            )
        )
    if gpus is not None and gpus > node_gpus and preflight.get("backend") != "cpu":
        out.append(
            finding(
                code="HW003",
                severity="error",
                path="gpus",
                message=f"asks for {gpus} GPUs; the node has {node_gpus}",
                fix=f"ask for at most {node_gpus}",
            )
        )
    if rocm and (gpus or 1) > 1:
        timeout = number(config.get("ddp_timeout"))
        if timeout is None or timeout < DDP_TIMEOUT_MIN_S:
            out.append(
                finding(
                    code="HW002",
                    severity="warning",
                    path="config.ddp_timeout",
                    message="multi-GPU on ROCm: starting the "
                    "process group can take longer than the default 1800 s and time out",
                    fix="set a large `ddp_timeout` (the seed uses 180000000)",
                )
            )
    if config.get("flash_attn") == "fa2" and not (preflight.get("packages") or {}).get("flash_attn"):
        out.append(
            finding(
                code="HW004",
                severity="warning",
                path="config.flash_attn",
                message="flash_attn: fa2 but flash-attn is not importable in the training environment",
                fix="install flash-attn built for this GPU, or set `flash_attn: auto`",
            )
        )
    return out


# ---------------------------------------------------------------- entry points


def read_model_config(model: Any, *, hub_only: bool = False) -> dict[str, Any] | None:
    """The model's config.json from a local folder (or the HF cache for a hub id); None if unreadable.
    `hub_only` (the server) never reads a folder named by the user, only the HF cache."""
    if not isinstance(model, str) or not model:
        return None
    candidates = [] if hub_only else [Path(os.path.expanduser(model)) / "config.json"]
    if not Path(model).is_absolute() and (snap := hubcache.snapshot(model)) is not None:
        candidates.append(snap / "config.json")
    for c in candidates:
        try:
            data = json.loads(c.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def hidden_size_of(model_config: dict[str, Any] | None) -> int | None:
    if not model_config:
        return None
    sub = model_config.get("text_config")
    text = sub if isinstance(sub, dict) else model_config
    h = text.get("hidden_size")
    return int(h) if isinstance(h, int) else None


def lint(
    config: dict[str, Any],
    ds: Any = None,
    *,
    gpus: int | None = None,
    preflight: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    mca: bool | None = None,
) -> list[Finding]:
    """Every finding for a train config and its (already loaded) DeepSpeed config, errors first.
    `mca` None: a Megatron-Core config is told by its keys; False: it runs without USE_MCA=1, where
    those keys are unknown (the server launches that way)."""
    mca = bool(MCA_KEYS & config.keys()) if mca is None else mca
    out = lint_lf_keys(config, mca=mca)
    if mca:
        out.append(
            finding(
                code="LF007",
                severity="info",
                path="config",
                message="a Megatron-Core config (run with USE_MCA=1): its "
                "parallelism keys come from mcore_adapter and are not checked",
                fix="none needed",
            )
        )
    out += lint_lf_semantics(config, model_config=model_config, output_dir=output_dir)
    if ds is not None:
        out += lint_deepspeed(ds, config, gpus=gpus, hidden_size=hidden_size_of(model_config))
    out += lint_hardware(config, ds if isinstance(ds, dict) else None, gpus=gpus, preflight=preflight)
    return sorted(out, key=lambda f: SEVERITIES.index(f["severity"]))


def yaml_kind(config: dict[str, Any]) -> str:
    """What a YAML in LLaMA-Factory's examples/ is, from its keys."""
    if ACCELERATE_KEYS & config.keys():
        return "an accelerate launcher config"
    if V1_KEYS & config.keys() or ("model" in config and "model_name_or_path" not in config):
        return "a LLaMA-Factory v1 config (another schema)"
    known = lf_table()["args"]
    if not any(k in known for k in config):
        return "not a train config (no LLaMA-Factory argument in it)"
    return "train"


def find_ds_file(value: str, base: Path) -> Path | None:
    """A YAML's `deepspeed:` path as LLaMA-Factory resolves it (from the working folder), else from
    the YAML's own folder upward (examples/ are run from the repository root)."""
    p = Path(os.path.expanduser(value))
    if p.is_absolute():
        return p if p.is_file() else None
    for root in [Path.cwd(), base, *base.parents]:
        if (root / p).is_file():
            return root / p
    return None


def lint_file(
    path: Path, *, gpus: int | None = None, preflight: dict[str, Any] | None = None
) -> list[Finding]:
    """Lint a LLaMA-Factory train YAML (with the DeepSpeed file it names) or a DeepSpeed JSON."""
    import yaml

    text = path.read_text()
    if path.suffix == ".json":
        try:
            return lint_deepspeed(json.loads(text), gpus=gpus)
        except ValueError as e:
            return [
                finding(
                    code="DS005",
                    severity="error",
                    path="deepspeed",
                    message=f"not valid JSON: {e}",
                    fix="fix the JSON syntax",
                )
            ]
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [
            finding(
                code="LF003",
                severity="error",
                path="config",
                message=f"not valid YAML: {e}",
                fix="fix the YAML syntax",
            )
        ]
    if not isinstance(config, dict):
        return [
            finding(
                code="LF003",
                severity="error",
                path="config",
                message="a train YAML must be a mapping of keys",
                fix="write key: value lines",
            )
        ]
    if (kind := yaml_kind(config)) != "train":
        return [
            finding(
                code="LF008",
                severity="info",
                path="config",
                message=f"{kind}, not a LLaMA-Factory train YAML: not checked",
                fix="none needed",
            )
        ]
    ds, extra = config.get("deepspeed"), []
    if isinstance(ds, str):
        found = find_ds_file(ds, path.parent) or presets().get(Path(ds).stem)
        try:
            ds = json.loads(found.read_text()) if found else None
        except (OSError, ValueError):
            ds = None
        if ds is None:
            extra.append(
                finding(
                    code="DS009",
                    severity="warning",
                    path="config.deepspeed",
                    message=f"DeepSpeed config {config['deepspeed']!r} "
                    "not found or not valid JSON; it was not checked",
                    fix="run from the folder the path is relative to, or give a preset name",
                )
            )
    out = lint(
        config,
        ds,
        gpus=gpus,
        preflight=preflight,
        model_config=read_model_config(config.get("model_name_or_path")),
        output_dir=Path(config["output_dir"]) if isinstance(config.get("output_dir"), str) else None,
    )
    return out + extra

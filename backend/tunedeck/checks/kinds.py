"""Job kinds: which `llamafactory-cli` command a job runs and the keys that make it that job.

`train`, `eval` and `predict` run `llamafactory-cli train` (the trainer's own do_eval/do_predict
paths, as LlamaBoard's Evaluate & Predict tab does); `export` runs `llamafactory-cli export` (merge a
LoRA adapter into its base model) and `chat` runs `llamafactory-cli api` (the OpenAI-compatible
server). The last two parse model, data, finetuning and generating arguments only: a trainer key
there stops them with "Some keys are not used by the HfArgumentParser", so it is refused at submit.

Both the server and the runner import this module; it imports nothing of either.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

Command = Literal["train", "export", "api"]
# The argument groups `llamafactory-cli export` and `api` parse (LLaMA-Factory's _INFER_ARGS).
INFER_GROUPS = {"ModelArguments", "DataArguments", "FinetuningArguments", "GeneratingArguments"}
# LLaMA-Factory's predict metrics (ComputeSimilarity) import these; its lean install lacks them.
PREDICT_PACKAGES = ("jieba", "nltk", "rouge-chinese")


@dataclass(frozen=True)
class Kind:
    name: str
    command: Command
    trainer: bool  # runs with the trainer's arguments: tunedeck sets output_dir
    forced: dict[str, Any] = field(default_factory=dict)  # tunedeck's; a different value is overridden
    defaults: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ("model_name_or_path",)
    packages: tuple[str, ...] = ()  # training-environment packages the kind needs
    what: str = ""


_NO_TRAIN = {"do_train": False, "overwrite_output_dir": True, "report_to": "none"}

KINDS: dict[str, Kind] = {
    "train": Kind(
        "train",
        "train",
        True,
        # A fresh output folder and a token count (throughput).
        forced={"overwrite_output_dir": True, "include_num_input_tokens_seen": True},
        defaults={"do_train": True, "report_to": "none"},
        required=("model_name_or_path", "dataset"),
        what="a fine-tune",
    ),
    "eval": Kind(
        "eval",
        "train",
        True,
        forced={**_NO_TRAIN, "do_eval": True, "do_predict": False, "predict_with_generate": False},
        defaults={"stage": "sft"},
        required=("model_name_or_path", "eval_dataset"),
        what="the loss of a model (and adapter) on eval_dataset",
    ),
    "predict": Kind(
        "predict",
        "train",
        True,
        forced={**_NO_TRAIN, "do_eval": False, "do_predict": True, "predict_with_generate": True},
        defaults={"stage": "sft"},
        required=("model_name_or_path", "eval_dataset"),
        packages=PREDICT_PACKAGES,
        what="generations for eval_dataset, scored with BLEU and ROUGE",
    ),
    "export": Kind(
        "export",
        "export",
        False,
        defaults={"export_size": 5, "export_device": "cpu"},
        what="the model with its adapter merged in, saved into the job's output folder",
    ),
    "chat": Kind("chat", "api", False, what="an OpenAI-compatible server of the model"),
}


def packages_needed() -> dict[str, list[str]]:
    """Each package some kind needs → the kinds that need it."""
    out: dict[str, list[str]] = {}
    for kind in KINDS.values():
        for package in kind.packages:
            out.setdefault(package, []).append(kind.name)
    return out


def of(name: str | None) -> Kind:
    return KINDS[name or "train"]


def _detail(loc: list[Any], msg: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": "value_error"}


def check(
    kind: Kind,
    config: dict[str, Any],
    *,
    args: dict[str, Any],
    gpus: int,
    preflight: dict[str, Any] | None,
    deepspeed: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """422 items and warnings for what this kind would fail on. `args` is the captured argument table."""
    errors: list[dict[str, Any]] = []
    warnings: list[str] = []
    for key in kind.required:
        if kind.name == "train" and key == "dataset" and config.get("do_train") is False:
            continue  # a train YAML that only evaluates or predicts, as LLaMA-Factory's examples have
        if config.get(key) in (None, ""):
            why = (
                {
                    "eval_dataset": f"the data a{'n' if kind.name == 'eval' else ''} {kind.name} job reads "
                    "(a dataset in dataset_info.json; `dataset` is for training)",
                    "model_name_or_path": "the base model (or an exported folder)",
                }.get(key, "")
                if kind.name != "train"
                else ""
            )
            what = "is required" if kind.name == "train" else f"is required for a {kind.name} job"
            errors.append(_detail(["config", key], what + (f": {why}" if why else "")))
    for key, value in kind.forced.items():
        if key in config and config[key] != value and key not in ("overwrite_output_dir", "report_to"):
            warnings.append(f"{key}: {config[key]!r} replaced by {value!r}: a {kind.name} job sets it")
    if kind.name == "predict" and config.get("stage", "sft") != "sft":
        errors.append(_detail(["config", "stage"], "a predict job generates with stage `sft` only"))
    if not kind.trainer and deepspeed:
        errors.append(_detail(["deepspeed"], f"a {kind.name} job does not train: give no DeepSpeed config"))
    if not kind.trainer:
        for key in config:
            group = (args.get(key) or {}).get("group")
            if group is not None and group not in INFER_GROUPS:
                errors.append(
                    _detail(
                        ["config", key],
                        f"is a training argument: `llamafactory-cli {kind.command}` refuses it "
                        "('Some keys are not used by the HfArgumentParser'); remove it",
                    )
                )
    if kind.name == "export":
        errors += _check_export(config, gpus=gpus)
    have = (preflight or {}).get("packages") or {}
    for package in kind.packages:
        key = package.replace("-", "_")
        if key in have and not have[key]:
            errors.append(
                _detail(
                    ["kind"],
                    f"a {kind.name} job needs `{package}` in the training environment and it is not "
                    f"installed there (pip install {package}; scripts/setup.sh installs it)",
                )
            )
    return errors, warnings


def _check_export(config: dict[str, Any], *, gpus: int) -> list[dict[str, Any]]:
    adapter, bits = config.get("adapter_name_or_path"), config.get("export_quantization_bit")
    out = []
    if adapter in (None, "") and bits is None:
        out.append(
            _detail(
                ["config", "adapter_name_or_path"],
                "is required for an export job: the LoRA adapter to merge (or set export_quantization_bit "
                "to quantise the model alone)",
            )
        )
    if bits is not None:
        if adapter not in (None, ""):
            out.append(
                _detail(
                    ["config", "export_quantization_bit"],
                    "cannot be used while merging an adapter (LLaMA-Factory refuses): export the merged "
                    "model first, then quantise that folder in a second export job",
                )
            )
        if gpus == 0:
            out.append(
                _detail(
                    ["config", "export_quantization_bit"],
                    "GPTQ quantisation needs a GPU (and optimum with gptqmodel); this job runs on the CPU",
                )
            )
        if config.get("export_quantization_dataset") in (None, ""):
            out.append(
                _detail(
                    ["config", "export_quantization_dataset"],
                    "is required with export_quantization_bit: the calibration data GPTQ reads",
                )
            )
    return out


def take_owned(kind: Kind, config: dict[str, Any]) -> list[str]:
    """Remove the keys tunedeck sets for this kind (before any check reads them); the warnings say so."""
    if kind.name != "export" or config.get("export_dir") is None:
        return []
    return [
        f"export_dir {config.pop('export_dir')!r} ignored: an export job writes into its own output folder"
    ]


def apply(kind: Kind, config: dict[str, Any]) -> None:
    """Set the kind's own keys on a config about to be rendered."""
    config.update(kind.forced)
    for key, value in kind.defaults.items():
        config.setdefault(key, value)


def output_key(kind: Kind) -> str | None:
    """The key that points the command at the job's output folder."""
    return "output_dir" if kind.trainer else "export_dir" if kind.name == "export" else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(job: Any) -> dict[str, str]:
    """Environment a job's command needs beyond the trainer's. A chat job's server binds 127.0.0.1 on a
    port free now, and wants a key only the tunedeck server knows; both are set on `job`, whose
    launch commits them."""
    if job.kind != "chat":
        return {}
    job.api_port, job.api_key = free_port(), secrets.token_urlsafe(24)
    return {"API_HOST": "127.0.0.1", "API_PORT": str(job.api_port), "API_KEY": job.api_key}

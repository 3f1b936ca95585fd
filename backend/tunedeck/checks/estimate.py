"""Per-GPU memory estimate of a fine-tune, before launch, from the model's config.json alone.

Parts (bytes, per GPU):
- `weights_frozen`, `weights_trainable`, `gradients`, `optimizer`: model states. With DeepSpeed they
  follow DeepSpeed's own estimators (P params, T trainable, L largest leaf layer, N GPUs):
  ZeRO-3 `4L + 18T/N` (+ `2F/N` for the frozen rest), optimizer offload `4L + 2P/N`, full offload
  `4L`; ZeRO-2 `2P + 18T/N` (offload: `2P`); ZeRO-1 `4T + 16T/N` (+ frozen). Without DeepSpeed, the
  HF Trainer keeps trainable weights in fp32 with fp32 grads and two Adam moments (16 bytes each)
  and frozen weights in the compute dtype.
- `activations`: per layer `2·s·b·(6h + (nh+2kv)·hd + 4i)` bytes at 16 bits (layer inputs, q/k/v,
  attention output, the gated MLP's four intermediates; SDPA/flash attention keeps no s² matrix).
  With gradient checkpointing (LLaMA-Factory's default) only each layer's input `s·b·h` is kept,
  plus one layer recomputed in full. LoRA adds its dropout'd inputs per target.
- `logits`: `s·b·V·(w + 8)`: the logits, their fp32 copy for the loss and the log-softmax kept
  for backward (the largest single activation with a 150k vocabulary).
- `buckets`: ZeRO communication buffers; with `overlap_comm` ≈4.5× the reduce + prefetch (ZeRO-3)
  or reduce + allgather (ZeRO-1/2) bucket sizes, "auto" filled as the HF integration does
  (reduce `h²`, prefetch `0.9·h²`).
- `runtime`: what no tensor counts: the HIP/CUDA context and kernels on a GPU; on the CPU the
  interpreter with torch, transformers and LLaMA-Factory imported, which depends on the training
  environment's versions, so the caller passes it (the `estimate_cpu_runtime_bytes` setting).
"""

from __future__ import annotations

import math
from typing import Any

from tunedeck.checks.lint import lf_value, number, truthy

GiB = 2**30
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RUNTIME_GPU = 512 * 2**20  # HIP/CUDA context + kernel images, seen by the SMI, not by torch
OVERLAP_FACTOR = 4.5
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")


class EstimateError(ValueError):
    pass


def _text_config(model_config: dict[str, Any]) -> dict[str, Any]:
    tc = model_config.get("text_config")
    return {**model_config, **tc} if isinstance(tc, dict) else model_config


def shapes(model_config: dict[str, Any]) -> dict[str, Any]:
    """The shapes that matter, with the usual defaults (kv heads = heads, head_dim = h / heads)."""
    c = _text_config(model_config)
    try:
        h, layers, heads, vocab = (
            int(c["hidden_size"]),
            int(c["num_hidden_layers"]),
            int(c["num_attention_heads"]),
            int(c["vocab_size"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise EstimateError(f"config.json lacks a decoder shape field: {e}") from None
    inter = int(c.get("intermediate_size") or 4 * h)
    kv = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or h // heads)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or 0)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    return {
        "hidden": h,
        "intermediate": inter,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "vocab": vocab,
        "tied": bool(c.get("tie_word_embeddings", False)),
        "qkv_bias": bool(c.get("attention_bias", c.get("model_type") in QKV_BIAS_TYPES)),
        "experts": experts,
        "moe_intermediate": moe_inter,
    }


def linears(s: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer in one decoder layer (per expert for MoE MLPs)."""
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    i = s["moe_intermediate"] if s["experts"] else s["intermediate"]
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def count_params(s: dict[str, Any]) -> dict[str, int]:
    """Parameter counts from the shapes: total, per layer, embeddings, largest leaf module."""
    lin = linears(s)
    mlp = sum(a * b for k, (a, b) in lin.items() if k in ("gate_proj", "up_proj", "down_proj"))
    attn = sum(a * b for k, (a, b) in lin.items() if k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if s["qkv_bias"]:
        attn += lin["q_proj"][1] + 2 * lin["k_proj"][1]
    if s["experts"]:
        mlp = mlp * s["experts"] + s["hidden"] * s["experts"]  # experts + router
    per_layer = attn + mlp + 2 * s["hidden"]  # two RMSNorms
    embed = s["vocab"] * s["hidden"]
    total = s["layers"] * per_layer + embed * (1 if s["tied"] else 2) + s["hidden"]
    largest = max(embed, *(a * b for a, b in lin.values()))
    return {"total": total, "per_layer": per_layer, "embedding": embed, "largest_layer": largest}


def _int(config: dict[str, Any], key: str) -> int:
    """A whole-number training argument as LLaMA-Factory takes it: the YAML's value or its default.
    0 is a value (`freeze_trainable_layers: 0` trains no layer), not a cue for a default; a value that
    is no number raises TypeError, which the caller reports (lint names the key)."""
    value = number(lf_value(config, key))
    if value is None:
        raise TypeError(f"{key} is not a number")
    return int(value)


def lora_targets(config: dict[str, Any]) -> list[str]:
    target = str(lf_value(config, "lora_target") or "all")
    if target.strip() == "all":
        return list(LINEAR_NAMES)
    return [t.strip() for t in target.split(",") if t.strip() in LINEAR_NAMES]


def trainable_params(config: dict[str, Any], s: dict[str, Any], counts: dict[str, int]) -> tuple[int, str]:
    method = str(lf_value(config, "finetuning_type") or "lora")
    if method == "full":
        return counts["total"], "full"
    if method == "freeze":
        n = _int(config, "freeze_trainable_layers")  # the last n layers, or the first -n
        return min(abs(n), s["layers"]) * counts["per_layer"], "freeze"
    rank = _int(config, "lora_rank")
    lin, mult = linears(s), (s["experts"] or 1)
    per_layer = sum(
        rank * (lin[t][0] + lin[t][1]) * (mult if t in ("gate_proj", "up_proj", "down_proj") else 1)
        for t in lora_targets(config)
    )
    return s["layers"] * per_layer, "lora"


def zero_of(ds: dict[str, Any] | None) -> dict[str, Any]:
    zero = (ds or {}).get("zero_optimization") or {}
    if not isinstance(zero, dict):
        zero = {}
    dev = lambda k: str(((zero.get(k) or {}) if isinstance(zero.get(k), dict) else {}).get("device", "none"))
    return {
        "stage": int(number(zero.get("stage")) or 0) if ds else None,
        "zero": zero,
        "offload_optimizer": dev("offload_optimizer") in ("cpu", "nvme"),
        "offload_param": dev("offload_param") in ("cpu", "nvme"),
    }


def model_states(
    *, total: int, trainable: int, largest: int, n: int, w: int, z: dict[str, Any]
) -> dict[str, int]:
    frozen = total - trainable
    stage = z["stage"]
    if stage is None or stage == 0:  # plain (DDP) training: everything replicated
        return {
            "weights_frozen": w * frozen,
            "weights_trainable": 4 * trainable,
            "gradients": 4 * trainable,
            "optimizer": 8 * trainable,
        }
    if stage == 3:
        if z["offload_param"]:
            return {
                "weights_frozen": 0,
                "weights_trainable": 0,
                "gradients": 0,
                "optimizer": 0,
                "gathered_layer": 4 * largest,
            }
        if z["offload_optimizer"]:
            return {
                "weights_frozen": math.ceil(2 * frozen / n),
                "weights_trainable": math.ceil(2 * trainable / n),
                "gradients": 0,
                "optimizer": 0,
                "gathered_layer": 4 * largest,
            }
        return {
            "weights_frozen": math.ceil(2 * frozen / n),
            "weights_trainable": math.ceil(2 * trainable / n),
            "gradients": math.ceil(2 * trainable / n),
            "optimizer": math.ceil(14 * trainable / n),
            "gathered_layer": 4 * largest,
        }
    # ZeRO-1/2: the 16-bit weights stay replicated.
    if z["offload_optimizer"]:
        return {
            "weights_frozen": 2 * frozen,
            "weights_trainable": 2 * trainable,
            "gradients": 0,
            "optimizer": 0,
        }
    if stage == 2:
        return {
            "weights_frozen": 2 * frozen,
            "weights_trainable": 2 * trainable,
            "gradients": math.ceil(2 * trainable / n),
            "optimizer": math.ceil(16 * trainable / n),
        }
    return {
        "weights_frozen": 2 * frozen,
        "weights_trainable": 2 * trainable,
        "gradients": 2 * trainable,
        "optimizer": math.ceil(16 * trainable / n),
    }


def activations(config: dict[str, Any], s: dict[str, Any], *, w: int, method: str) -> dict[str, int]:
    b, seq = _int(config, "per_device_train_batch_size"), _int(config, "cutoff_len")
    h, i = s["hidden"], (s["moe_intermediate"] if s["experts"] else s["intermediate"])
    qkv = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    full_layer = w * seq * b * (6 * h + qkv + 4 * i)
    if method == "lora" and float(number(lf_value(config, "lora_dropout")) or 0) > 0:
        lin = linears(s)
        full_layer += w * seq * b * sum(lin[t][0] for t in lora_targets(config))
    checkpointing = not truthy(lf_value(config, "disable_gradient_checkpointing"))
    if checkpointing:
        act = s["layers"] * w * seq * b * h + full_layer
    else:
        act = s["layers"] * full_layer
    return {
        "activations": act,
        "logits": seq * b * s["vocab"] * (w + 8),
        "_checkpointing": int(checkpointing),
        "_tokens": seq * b,
    }


def buckets(z: dict[str, Any], s: dict[str, Any]) -> int:
    if z["stage"] in (None, 0):
        return 0
    zero, h = z["zero"], s["hidden"]
    auto = {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h)}

    def size(key: str, default: float) -> float:
        v = zero.get(key, default)
        return auto.get(key, default) if v == "auto" else (number(v) or 0.0)

    if z["stage"] == 3:
        elems = size("reduce_bucket_size", 5e8) + size(
            "stage3_prefetch_bucket_size", number(zero.get("prefetch_bucket_size")) or 5e7
        )
    else:
        elems = size("reduce_bucket_size", 5e8) + size("allgather_bucket_size", 5e8)
    overlap = zero.get("overlap_comm")
    overlap = (z["stage"] == 3) if overlap is None else truthy(overlap)  # DeepSpeed's dynamic default
    return int(elems * 2 * (OVERLAP_FACTOR if overlap else 1))


def estimate(
    *,
    model_config: dict[str, Any],
    config: dict[str, Any],
    ds: dict[str, Any] | None,
    gpus: int,
    nodes: int = 1,
    device_total_bytes: int | None = None,
    cpu_runtime_bytes: int = 0,
) -> dict[str, Any]:
    """The per-GPU figure, its breakdown (bytes), and warnings; `gpus=0` estimates a CPU run.

    `gpus` is per node, as a job spec gives it: ZeRO partitions over every rank of every node
    (`nodes` × `gpus`; one rank a node on the CPU)."""
    if nodes < 1:
        raise EstimateError(f"nodes must be 1 or more, not {nodes}")
    s = shapes(model_config)
    counts = count_params(s)
    trainable, method = trainable_params(config, s, counts)
    half = truthy(config.get("fp16")) or truthy(config.get("bf16")) or truthy(config.get("pure_bf16"))
    w = 2 if half else 4
    z = zero_of(ds)
    n = max(gpus, 1) * nodes  # the ranks ZeRO shards over
    breakdown = model_states(
        total=counts["total"], trainable=trainable, largest=counts["largest_layer"], n=n, w=w, z=z
    )
    act = activations(config, s, w=w, method=method)
    breakdown.update(
        {
            "activations": act["activations"],
            "logits": act["logits"],
            "buckets": buckets(z, s),
            "runtime": RUNTIME_GPU if gpus > 0 else cpu_runtime_bytes,
        }
    )
    per_gpu = sum(breakdown.values())
    fits = None if device_total_bytes is None else per_gpu <= device_total_bytes
    warnings = []
    if device_total_bytes is not None and per_gpu > device_total_bytes:  # fits is False
        warnings.append(
            f"estimated {per_gpu / GiB:.1f} GiB per GPU exceeds the device's "
            f"{device_total_bytes / GiB:.1f} GiB: use ZeRO-3, offload, a smaller micro batch or "
            "cutoff_len, or gradient checkpointing"
        )
    if ds is not None and z["stage"] in (None, 0) and n > 1:
        warnings.append("DeepSpeed config without zero_optimization.stage: every GPU holds the whole model")
    return {
        "per_gpu_bytes": int(per_gpu),
        "breakdown": {k: int(v) for k, v in breakdown.items()},
        "device_total_bytes": device_total_bytes,
        "fits": fits,
        "warnings": warnings,
        "params": counts["total"],
        "trainable_params": trainable,
        "method": method,
        "zero_stage": z["stage"],
        "gpus": gpus,
        "nodes": nodes,
        "ranks": n,
        "dtype_bytes": w,
        "gradient_checkpointing": bool(act["_checkpointing"]),
        "tokens_per_micro_batch": act["_tokens"],
    }

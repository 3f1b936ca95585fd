"""Suggestions written from the job's actual config: the train.yaml keys and the DeepSpeed file."""

from __future__ import annotations

from typing import Any

from tunedeck.alerts.series import Series


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except (TypeError, ValueError):
        return None


def sci(v: float) -> str:
    return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")


def zero(s: Series) -> dict[str, Any]:
    return (s.ds or {}).get("zero_optimization") or {}


def ga(s: Series) -> int:
    return int(_num(s.config.get("gradient_accumulation_steps")) or 1)


def batch(s: Series) -> int:
    return int(_num(s.config.get("per_device_train_batch_size")) or 1)


def fp16(s: Series) -> bool:
    if s.config.get("fp16") is True:
        return True
    return bool(((s.ds or {}).get("fp16") or {}).get("enabled") is True)


def _bucket(s: Series, key: str, alias: str | None = None) -> str | None:
    z = zero(s)
    name = key if key in z else alias if alias and alias in z else None
    if name is None:
        return None
    v = z[name]
    if v == "auto":
        return f'zero_optimization.{name} is "auto" (hidden² elements): set it explicitly, e.g. 5e7'
    n = _num(v)
    return f"lower zero_optimization.{name} from {sci(n)} to {sci(n / 10)}" if n else None


def reduce_bucket(s: Series) -> str | None:
    return _bucket(s, "reduce_bucket_size")


def prefetch_bucket(s: Series) -> str | None:
    return _bucket(s, "stage3_prefetch_bucket_size", "prefetch_bucket_size")


def smaller_batch(s: Series) -> str:
    bs, g = batch(s), ga(s)
    if bs > 1:
        return (
            f"lower per_device_train_batch_size from {bs} to {max(1, bs // 2)} and raise "
            f"gradient_accumulation_steps from {g} to {g * 2} (same effective batch)"
        )
    cl = _num(s.config.get("cutoff_len"))
    return (
        f"lower cutoff_len from {int(cl)} to {int(cl) // 2}"
        if cl and cl > 256
        else "use a smaller micro-batch"
    )


def memory_relief(s: Series) -> str:
    """What frees memory, most effective first, for this config."""
    tips = [smaller_batch(s)]
    if s.config.get("disable_gradient_checkpointing"):
        tips.append("remove disable_gradient_checkpointing (recompute activations)")
    z = zero(s)
    stage = int(_num(z.get("stage")) or 0) if s.ds else 0
    if s.ds is None:
        tips.append("use DeepSpeed ZeRO-3 (the ds_z3_rocm preset) to shard optimizer state across GPUs")
    elif stage < 3:
        tips.append(f"move from ZeRO-{stage} to ZeRO-3")
    elif not z.get("offload_optimizer"):
        tips.append('add zero_optimization.offload_optimizer: {"device": "cpu"}')
    if not s.devices:
        tips.append("or raise TUNEDECK_TRAINER_RLIMIT_AS_BYTES on this CPU node")
    return "; ".join(tips)


def on_gpu(s: Series) -> str:
    names = [n for n in s.gpu_names.values() if n]
    return f" ({names[0]})" if names else ""


def precision(s: Series) -> str:
    if fp16(s):
        return f"fp16 is on{on_gpu(s)}: set bf16: true and fp16: false (MI250/MI300 run bf16 natively)"
    return ""


def learning_rate(s: Series, factor: int) -> str:
    lr = _num(s.config.get("learning_rate"))
    return f"lower learning_rate from {sci(lr)} to {sci(lr / factor)}" if lr else "lower learning_rate"

"""Suggestions written from the job's actual config: the train.yaml keys and the DeepSpeed file.

Each suggestion says what follows from it (what it costs, what else moves), and one that is a
change of train.yaml keys carries that change, so a page can offer the edited job in one click."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tunedeck.alerts.series import Series


@dataclass(frozen=True)
class Tip:
    text: str
    change: dict[str, Any] | None = None  # train.yaml key -> new value; None: not a key change

    def __bool__(self) -> bool:
        return bool(self.text)


def combine(tips: Sequence[Tip | str | None], sep: str = "; ") -> tuple[str, dict[str, Any] | None]:
    """The tips as one text, and the change of the first that is a key change (what one click runs).
    A tip that is None or empty is left out."""
    given = [t if isinstance(t, Tip) else Tip(t) for t in tips if t]
    return sep.join(t.text for t in given), next((t.change for t in given if t.change), None)


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v))
    except (TypeError, ValueError):
        return None


def number(v: Any) -> float | None:
    """A train.yaml value as a number (None: not one)."""
    return _num(v)


def sci(v: float) -> str:
    return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")


def zero(s: Series) -> dict[str, Any]:
    return (s.ds or {}).get("zero_optimization") or {}


def ga(s: Series) -> int:
    return int(_num(s.config.get("gradient_accumulation_steps")) or 1)


def warmup_steps(s: Series) -> int:
    """The learning-rate warm-up in steps: warmup_steps, or warmup_ratio of max_steps (0 when a ratio
    has no max_steps to apply to: the total is not known ahead)."""
    ws = _num(s.config.get("warmup_steps"))
    if ws and ws > 0:
        return int(ws)
    ratio, most = _num(s.config.get("warmup_ratio")), _num(s.config.get("max_steps"))
    return int(ratio * most) if ratio and most and ratio > 0 and most > 0 else 0


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
    return (
        f"lower zero_optimization.{name} from {sci(n)} to {sci(n / 10)} (a lower peak for that buffer; "
        "more, smaller collectives, a little slower)"
        if n
        else None
    )


def reduce_bucket(s: Series) -> str | None:
    return _bucket(s, "reduce_bucket_size")


def prefetch_bucket(s: Series) -> str | None:
    return _bucket(s, "stage3_prefetch_bucket_size", "prefetch_bucket_size")


def smaller_batch(s: Series) -> Tip:
    bs, g = batch(s), ga(s)
    if bs > 1:
        return Tip(
            f"lower per_device_train_batch_size from {bs} to {max(1, bs // 2)} and raise "
            f"gradient_accumulation_steps from {g} to {g * 2} (the effective batch stays {bs * g} per GPU; "
            "activation memory about halves; each step runs twice as many smaller micro-batches, so "
            "throughput may drop)",
            {"per_device_train_batch_size": max(1, bs // 2), "gradient_accumulation_steps": g * 2},
        )
    cl = _num(s.config.get("cutoff_len"))
    if cl and cl > 256:
        return Tip(
            f"lower cutoff_len from {int(cl)} to {int(cl) // 2} (the longest batches need about half the "
            f"activation memory; samples longer than {int(cl) // 2} tokens lose their ends from training)",
            {"cutoff_len": int(cl) // 2},
        )
    return Tip("use a smaller micro-batch")


def memory_relief(s: Series) -> Tip:
    """What frees memory, most effective first, for this config."""
    tips: list[Tip | str] = [smaller_batch(s)]
    if s.config.get("disable_gradient_checkpointing"):
        tips.append(
            Tip(
                "remove disable_gradient_checkpointing (activations are recomputed in the backward pass: "
                "far less activation memory, steps about a quarter slower)",
                {"disable_gradient_checkpointing": False},
            )
        )
    z = zero(s)
    stage = int(_num(z.get("stage")) or 0) if s.ds else 0
    if s.ds is None:
        tips.append(
            "use DeepSpeed ZeRO-3 (the ds_z3_rocm preset) to shard optimizer state across GPUs (less "
            "memory per GPU, more communication per step; no gain on one GPU without offload)"
        )
    elif stage < 3:
        tips.append(
            f"move from ZeRO-{stage} to ZeRO-3 (parameters sharded too: less memory per GPU, an "
            "all-gather per layer each step)"
        )
    elif not z.get("offload_optimizer"):
        tips.append(
            'add zero_optimization.offload_optimizer: {"device": "cpu"} (optimizer state moves to host '
            "RAM: frees GPU memory, steps get slower over PCIe and need that much host RAM)"
        )
    if not s.devices:
        tips.append("or raise TUNEDECK_TRAINER_RLIMIT_AS_BYTES on this CPU node")
    text, change = combine(tips)
    return Tip(text, change)


def on_gpu(s: Series) -> str:
    names = [n for n in s.gpu_names.values() if n]
    return f" ({names[0]})" if names else ""


def precision(s: Series) -> Tip:
    if fp16(s):
        return Tip(
            f"fp16 is on{on_gpu(s)}: set bf16: true and fp16: false (MI250/MI300 run bf16 natively; bf16 "
            "has fp32's range, so no overflow to inf and no loss scaling, at the same memory; "
            "the GPU must support bf16)",
            {"bf16": True, "fp16": False},
        )
    return Tip("")


def learning_rate(s: Series, factor: int) -> Tip:
    lr = _num(s.config.get("learning_rate"))
    if not lr:
        return Tip("lower learning_rate")
    return Tip(
        f"lower learning_rate from {sci(lr)} to {sci(lr / factor)} (smaller, steadier updates; the loss "
        "falls more slowly, so it may need more steps)",
        {"learning_rate": float(f"{lr / factor:.3g}")},
    )


def accumulate_more(s: Series) -> Tip:
    g, bs = ga(s), batch(s)
    return Tip(
        f"raise gradient_accumulation_steps from {g} to {g * 2} for a steadier gradient (the effective "
        f"batch doubles to {bs * g * 2} per GPU and there are half as many optimizer steps per epoch; "
        "memory stays the same)",
        {"gradient_accumulation_steps": g * 2},
    )


def optimizer_peak(s: Series, micro_batches: float | None) -> Tip:
    """For spikes at the optimizer step: what the step itself holds (gradients reduced, the optimizer's
    update and its temporaries). gradient_accumulation_steps sets only how often it comes, never how
    high, so it is no change to make; ZeRO's reduce bucket is, where the config has one."""
    g = ga(s)
    often = (
        f"gradient_accumulation_steps is {g} and the spikes recur every {micro_batches:.0f} micro-batches"
        if micro_batches
        else f"gradient_accumulation_steps is {g}"
    )
    return Tip(
        f"the optimizer step's own working memory (gradients reduced, the optimizer's update): expected at "
        f"every step and as high at any accumulation ({often}: that sets how often, not how high); keep "
        "that much headroom above the level between steps"
    )


def plateau_headroom(s: Series, free: str) -> Tip:
    bs, g = batch(s), ga(s)
    return Tip(
        f"{free} headroom: per_device_train_batch_size {bs} could go to {bs * 2} for throughput (about twice "
        f"the activation memory; the effective batch doubles to {bs * 2 * g} per GPU unless "
        f"gradient_accumulation_steps halves)",
        {"per_device_train_batch_size": bs * 2},
    )


class Usual(NamedTuple):
    """The learning rates a finetuning type is trained with (LLaMA-Factory's examples, the methods'
    papers) and the one its examples use; FAR_ABOVE times the top or FAR_BELOW below the bottom is
    not a choice but a slip (lint LF020 says so before the run, `unstick` and `no_gradient` after)."""

    low: float
    high: float
    typical: float
    what: str


USUAL_LR = {
    "lora": Usual(1e-5, 1e-3, 1e-4, "LoRA fine-tunes"),
    "oft": Usual(1e-5, 1e-3, 1e-4, "OFT fine-tunes"),
    "freeze": Usual(1e-6, 1e-4, 1e-5, "freeze (partial) fine-tunes"),
    "full": Usual(1e-6, 1e-4, 1e-5, "full fine-tunes"),
}
FAR_ABOVE, FAR_BELOW = 10.0, 100.0


def usual_lr(config: dict[str, Any]) -> Usual | None:
    """The usual range of the config's finetuning type (LLaMA-Factory's default: lora)."""
    return USUAL_LR.get(str(config.get("finetuning_type") or "lora"))


def wrecking_lr(s: Series) -> Tip | None:
    """A learning rate far above the usual range: the first updates wreck the weights."""
    lr, usual = _num(s.config.get("learning_rate")), usual_lr(s.config)
    if not lr or usual is None or lr <= usual.high * FAR_ABOVE:
        return None
    return Tip(
        f"learning_rate is {lr:g}, far above the {usual.low:.0e} to {usual.high:.0e} {usual.what} use: the "
        "first updates wrecked the weights and the model now predicts the same thing whatever the input; "
        f"set it to {usual.typical:g} (the run starts over from the base model; the loss should then fall "
        "within the first hundred steps)",
        {"learning_rate": usual.typical},
    )


def unstick(s: Series) -> Tip:
    """A loss flat at its starting height: the updates broke the model, or nothing trains."""
    if wrecking := wrecking_lr(s):
        return wrecking
    low = learning_rate(s, 10)
    return Tip(
        f"{low.text}; if the loss never moved at all, check that something trains: labels not all masked "
        "(template, cutoff_len) and trainable parameters present (finetuning_type, lora_target)",
        low.change,
    )


def frozen() -> Tip:
    """A loss that came down, then stopped moving at all: the updates no longer change the model. What
    stopped them is not in the loss (the learning rate's schedule, gradients, data), so no key change."""
    return Tip(
        "look at what stopped the updates: the learning rate at these steps (lr_scheduler_type and its "
        "end: a schedule that has decayed to 0, or an lr column at 0), grad_norm (0: nothing flows back), "
        "and whether the data still varies (a dataset shorter than the steps repeats; a stream that ended "
        "feeds the same batch)"
    )


def tiny_lr(s: Series, *, slip: bool, ramp: bool, peak: float) -> Tip:
    """A loss flat under a learning rate of about 0: what set it so."""
    usual = usual_lr(s.config)
    if slip:  # the configured rate itself (0, or a typo's exponent)
        lr = _num(s.config.get("learning_rate"))
        said = f"learning_rate is {lr:g}" if lr is not None else "learning_rate is unset"
        if usual is None:
            return Tip(f"{said}, far too low for the weights to move: raise it")
        return Tip(
            f"{said}, far below the {usual.low:.0e} to {usual.high:.0e} {usual.what} use: the updates are too "
            f"small to move the weights; set it to {usual.typical:g} (the run starts over; the loss should "
            "then fall within the first hundred steps)",
            {"learning_rate": usual.typical},
        )
    if ramp:
        ws, ratio = _num(s.config.get("warmup_steps")), _num(s.config.get("warmup_ratio"))
        now = f"warmup_steps {ws:g}" if ws else f"warmup_ratio {ratio:g}" if ratio else "its warm-up"
        return Tip(
            f"the learning rate is still climbing its warm-up ramp ({now}), at {peak:.2g} so far: the warm-up "
            "is far longer than the run; set warmup_steps: 0 and warmup_ratio: 0.1 (the rate reaches "
            "learning_rate after a tenth of the steps)",
            {"warmup_steps": 0, "warmup_ratio": 0.1},
        )
    kind = str(s.config.get("lr_scheduler_type") or "cosine")
    new = "cosine" if kind != "cosine" else "constant_with_warmup"
    return Tip(
        f"the scheduler (lr_scheduler_type {kind}{' with lr_scheduler_kwargs' if s.config.get('lr_scheduler_kwargs') else ''}) "
        f"gives about 0 from the start although learning_rate is set: set lr_scheduler_type: {new} with no "
        "lr_scheduler_kwargs (the rate then starts at learning_rate after the warm-up)",
        {"lr_scheduler_type": new},
    )


def revive(s: Series) -> Tip:
    """Gradients that are exactly zero: the weights no longer change."""
    if wrecking := wrecking_lr(s):
        return wrecking
    if _num(s.config.get("learning_rate")) == 0:
        usual = usual_lr(s.config)
        return Tip(
            "learning_rate is 0: nothing trains"
            + (f"; {usual.what} use {usual.low:.0e} to {usual.high:.0e}" if usual else ""),
            {"learning_rate": usual.typical} if usual else None,
        )
    return Tip(
        "check that something trains: trainable parameters present (finetuning_type, lora_target, "
        "freeze_trainable_layers) and labels not all masked (template, cutoff_len, train_on_prompt)"
    )


def step_events(config: dict[str, Any]) -> tuple[int, int]:
    """(save_steps, eval_steps) of a train.yaml as the Trainer runs them (its defaults: a save every
    500 steps, no evaluation; eval_steps defaults to logging_steps); 0: none, or not counted in steps
    (a ratio of the total, or by epoch)."""

    def n(v: object) -> int:
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else 0

    def by_steps(v: object) -> bool:
        return str(v).lower() == "steps"

    save = n(config.get("save_steps", 500)) if by_steps(config.get("save_strategy") or "steps") else 0
    ev = config.get("eval_steps")
    ev = config.get("logging_steps", 500) if ev is None else ev
    strategy = config.get("eval_strategy") or config.get("evaluation_strategy") or "no"
    return save, n(ev) if by_steps(strategy) else 0


def _near(a: float, b: float) -> bool:
    return b > 0 and abs(a - b) <= 0.15 * b


def spike_cause(s: Series, steps_apart: float | None, at_saves: bool) -> str:
    """What recurs with periodic spikes `steps_apart` optimizer steps apart (None: steps unknown):
    "save" (checkpoint saves: save_steps, or the output's save lines at the spikes), "eval"
    (eval_steps), "logging" (logging_steps), "optimizer" (every step), "other", or "" (unknown)."""
    save, ev = step_events(s.config)
    if at_saves or (steps_apart is not None and _near(steps_apart, save)):
        return "save"
    if steps_apart is None:
        return ""
    if _near(steps_apart, ev):
        return "eval"
    log = _num(s.config.get("logging_steps")) or 0
    if log > 1 and _near(steps_apart, log):
        return "logging"
    return "optimizer" if _near(steps_apart, 1) else "other"


def gathers_on_save(s: Series) -> bool:
    """ZeRO-3 set to gather the whole 16-bit model onto each GPU when it saves."""
    z = zero(s)
    flag = z.get("stage3_gather_16bit_weights_on_model_save", z.get("gather_16bit_weights_on_model_save"))
    return _num(z.get("stage")) == 3 and flag is True


def save_peak(s: Series, added: str, peak: str) -> Tip:
    """Spikes at checkpoint saves: expected; what they need is headroom."""
    save, _ = step_events(s.config)
    every = f" (save_steps {save})" if save else ""
    if gathers_on_save(s):
        return Tip(
            f"expected: at every checkpoint save{every} ZeRO-3 gathers the full 16-bit weights onto each GPU "
            f"to write them (zero_optimization.stage3_gather_16bit_weights_on_model_save: true); keep "
            f"{added} of headroom above the training level for it (the peak reaches {peak}). If that nears "
            "capacity, set it to false in the DeepSpeed file (checkpoints then hold ZeRO shards only; "
            "zero_to_fp32.py rebuilds the weights from them). Fewer accumulation steps would not change it"
        )
    return Tip(
        f"expected: saving a checkpoint{every} copies the weights and optimizer state; keep {added} of "
        f"headroom above the training level for it (the peak reaches {peak}); a higher save_steps makes "
        "it rarer, not lower"
    )


def eval_peak(s: Series, added: str, peak: str) -> Tip:
    """Spikes at evaluations: expected; a smaller eval batch lowers them."""
    _, ev = step_events(s.config)
    lead = (
        f"expected: each evaluation (eval_steps {ev}) holds eval batches and their logits; keep {added} of "
        f"headroom for it (the peak reaches {peak})"
    )
    b = int(_num(s.config.get("per_device_eval_batch_size")) or 0)
    if b > 1:
        return Tip(
            f"{lead}; if it nears capacity, lower per_device_eval_batch_size from {b} to {b // 2} (about half "
            "the eval activations and logits; evaluation takes longer; training is unchanged)",
            {"per_device_eval_batch_size": b // 2},
        )
    return Tip(f"{lead}; if it nears capacity, evaluate on a smaller eval set or with a shorter cutoff_len")

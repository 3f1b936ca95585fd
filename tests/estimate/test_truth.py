"""The estimate against truths it was not written from: the real weights, published sizes, DeepSpeed.

Nothing here re-derives a figure from the estimate's own formulas: parameter counts come from the
tensors in a safetensors file, from a model loaded by transformers and counted by DeepSpeed, or from a
model card; the ZeRO model states come from DeepSpeed's estimator functions and from the ZeRO paper.
"""

from __future__ import annotations

import json
import math
import struct

import pytest

from tests.estimate.test_estimate import QWEN2_7B
from tunedeck.checks import estimate as est
from tunedeck.checks import lint

STATES = ("weights_frozen", "weights_trainable", "gradients", "optimizer", "gathered_layer")
FULL = {"finetuning_type": "full", "fp16": True, "per_device_train_batch_size": 1, "cutoff_len": 16}
# Qwen2-7B's config.json as published on the hub (Qwen/Qwen2-7B).
QWEN2_7B_CONFIG = {**QWEN2_7B, "architectures": ["Qwen2ForCausalLM"], "torch_dtype": "bfloat16"}
# Its model.safetensors.index.json: "total_size": 15231233024 bytes of bf16 tensors; "7.62B" on the card.
QWEN2_7B_PARAMS = 15_231_233_024 // 2
# Its largest module is the embedding: model.embed_tokens.weight has shape [152064, 3584].
QWEN2_7B_LARGEST = 152064 * 3584


def safetensors_params(path) -> tuple[int, int]:
    """(all parameters, the largest tensor) summed from the file's header, no tensor loaded."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    sizes = [math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__"]
    return sum(sizes), max(sizes)


def model_states(model_config: dict, ds: dict, gpus: int, config: dict = FULL) -> int:
    b = est.estimate(model_config=model_config, config=config, ds=ds, gpus=gpus)["breakdown"]
    return sum(b.get(k, 0) for k in STATES)


def zero(stage: int, offload_optimizer: bool = False, offload_param: bool = False) -> dict:
    z: dict = {"stage": stage}
    if offload_optimizer:
        z["offload_optimizer"] = {"device": "cpu"}
    if offload_param:
        z["offload_param"] = {"device": "cpu"}
    return {"zero_optimization": z}


@pytest.fixture(scope="module")
def demo_model(assets):
    return assets / "demo" / "model"


def test_demo_model_counted_from_its_safetensors(demo_model):
    total, _ = safetensors_params(demo_model / "model.safetensors")
    config = lint.read_model_config(str(demo_model))
    assert est.estimate(model_config=config, config=FULL, ds=None, gpus=1)["params"] == total


def test_qwen2_7b_matches_its_published_size(tmp_path):
    folder = tmp_path / "Qwen2-7B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_7B_CONFIG))
    config = lint.read_model_config(str(folder))
    params = est.estimate(model_config=config, config=FULL, ds=None, gpus=1)["params"]
    assert params == QWEN2_7B_PARAMS
    assert f"{params / 1e9:.2f}B" == "7.62B"


def deepspeed_estimators():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return stage3, stage_1_and_2


def test_model_states_match_deepspeeds_own_estimators(demo_model, tmp_path):
    """DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs`, fed with the demo model as transformers
    loads it and DeepSpeed counts it (shared weights once, largest module), and with Qwen2-7B's
    published figures. Rounding differs by a byte or two (DeepSpeed floors one sum, we ceil each part)."""
    stage3, stage_1_and_2 = deepspeed_estimators()
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo_model))
    demo_total, demo_largest = stage3.model_to_params(model)
    cases = [
        (lint.read_model_config(str(demo_model)), demo_total, demo_largest),
        (QWEN2_7B_CONFIG, QWEN2_7B_PARAMS, QWEN2_7B_LARGEST),
    ]
    for config, total, largest in cases:
        for gpus in (1, 2, 4, 8, 64):
            truth = {
                "zero3": stage3.estimate_zero3_model_states_mem_needs(
                    total, largest, num_gpus_per_node=gpus, cpu_offload=False
                )[1],
                "zero3 offload optimizer": stage3.estimate_zero3_model_states_mem_needs(
                    total, largest, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=False
                )[1],
                "zero3 offload all": stage3.estimate_zero3_model_states_mem_needs(
                    total, largest, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=True
                )[1],
                "zero2": stage_1_and_2.estimate_zero2_model_states_mem_needs(
                    total, num_gpus_per_node=gpus, cpu_offload=False
                )[1],
                "zero2 offload optimizer": stage_1_and_2.estimate_zero2_model_states_mem_needs(
                    total, num_gpus_per_node=gpus, cpu_offload=True
                )[1],
            }
            ours = {
                "zero3": model_states(config, zero(3), gpus),
                "zero3 offload optimizer": model_states(config, zero(3, offload_optimizer=True), gpus),
                "zero3 offload all": model_states(config, zero(3, True, True), gpus),
                "zero2": model_states(config, zero(2), gpus),
                "zero2 offload optimizer": model_states(config, zero(2, offload_optimizer=True), gpus),
            }
            for case, expected in truth.items():
                assert abs(ours[case] - expected) <= 3, (
                    config["hidden_size"],
                    gpus,
                    case,
                    ours[case],
                    expected,
                )
            # With the optimizer offloaded, DeepSpeed's GPU share is the 16-bit weights whatever is trainable:
            # training the last layer only holds as much as training all of them.
            freeze = {**FULL, "finetuning_type": "freeze", "freeze_trainable_layers": 1}
            for case, ds in (
                ("zero3 offload optimizer", zero(3, offload_optimizer=True)),
                ("zero3 offload all", zero(3, True, True)),
                ("zero2 offload optimizer", zero(2, offload_optimizer=True)),
            ):
                assert abs(model_states(config, ds, gpus, freeze) - truth[case]) <= 3, (
                    config["hidden_size"],
                    gpus,
                    case,
                )


# The ZeRO paper (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models", 2020, Figure 1; restated in DeepSpeed's ZeRO tutorial): mixed-precision Adam keeps 2Ψ bytes of
# fp16 weights, 2Ψ of fp16 gradients and K·Ψ = 12Ψ of fp32 weights, momentum and variance, so per GPU
# over N GPUs: P_os (ZeRO-1) 4Ψ + 12Ψ/N, P_os+g (ZeRO-2) 2Ψ + 14Ψ/N, P_os+g+p (ZeRO-3) 16Ψ/N.
PAPER = {
    1: lambda p, n: 4 * p + 12 * p / n,
    2: lambda p, n: 2 * p + 14 * p / n,
    3: lambda p, n: 16 * p / n,
}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_model_states_against_the_zero_paper(stage):
    """The paper counts the states alone; DeepSpeed also holds an fp32 gradient partition (4Ψ/N, ≤ 25 %
    over the paper at any N) and, under ZeRO-3, one gathered fp32 layer: within that, never below."""
    for gpus in (1, 2, 4, 8, 16, 64, 512):
        paper = PAPER[stage](QWEN2_7B_PARAMS, gpus)
        ours = model_states(QWEN2_7B_CONFIG, zero(stage), gpus)
        gathered = 4 * QWEN2_7B_LARGEST if stage == 3 else 0
        assert paper <= ours <= 1.25 * paper + gathered, (stage, gpus, ours / paper)

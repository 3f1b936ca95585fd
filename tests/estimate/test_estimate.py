"""VRAM estimate against hand-computed breakdowns, the real tiny model's weights and the seed's 14 GB."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys

import pytest

from tests.utils.servers import CONFIGS
from tests.utils.toy_model import TOY_QWEN2 as TOY  # 1736 parameters, counted by hand there
from tunedeck.checks import estimate as est

GiB = 2**30
SEED_DS = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())
# LoRA r=2 on all 7 linears: q 2·(8+8), k 2·(8+4), v 2·(8+4), o 2·(8+8), gate/up/down 2·(8+16) = 256 a layer.
TOY_LORA = {
    "finetuning_type": "lora",
    "lora_rank": 2,
    "lora_target": "all",
    "lora_dropout": 0,
    "per_device_train_batch_size": 1,
    "cutoff_len": 4,
    "fp16": True,
}
# Qwen2-7B's published config.json values.
QWEN2_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
SEED_YAML = {
    "finetuning_type": "lora",
    "lora_target": "all",
    "lora_rank": 16,
    "lora_dropout": 0.1,
    "cutoff_len": 2048,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "fp16": True,
}


def test_parameter_counts_by_hand():
    counts = est.count_params(est.shapes(TOY))
    assert counts == {"total": 1736, "per_layer": 608, "embedding": 256, "largest_layer": 256}
    assert est.trainable_params(TOY_LORA, est.shapes(TOY), counts) == (512, "lora")
    assert est.trainable_params({**TOY_LORA, "lora_target": "q_proj,v_proj"}, est.shapes(TOY), counts)[
        0
    ] == 2 * (32 + 24)
    assert est.trainable_params(
        {"finetuning_type": "freeze", "freeze_trainable_layers": 1}, est.shapes(TOY), counts
    ) == (608, "freeze")


def test_unset_and_zero_values_are_taken_as_llamafactory_takes_them():
    """An unset key is LLaMA-Factory's default (lora_rank 8, freeze_trainable_layers 2); a 0 is a 0."""
    s = est.shapes(TOY)
    counts = est.count_params(s)
    lora_in_out = 2 * 128  # per-layer in+out of the 7 linears (TOY_LORA's 256 at rank 2), 2 layers
    assert est.trainable_params({"finetuning_type": "lora"}, s, counts) == (8 * lora_in_out, "lora")
    freeze = {"finetuning_type": "freeze"}
    assert est.trainable_params(freeze, s, counts)[0] == 2 * 608
    # LLaMA-Factory trains the last n layers, or the first -n; 0 trains none (model/adapter.py).
    for n, layers in ((0, 0), (-1, 1), (1, 1), (5, 2), (-5, 2)):
        assert est.trainable_params({**freeze, "freeze_trainable_layers": n}, s, counts)[0] == layers * 608, n
    for method, key in (("freeze", "freeze_trainable_layers"), ("lora", "lora_rank"), ("lora", "cutoff_len")):
        with pytest.raises(TypeError):  # no number, no estimate
            est.estimate(model_config=TOY, config={"finetuning_type": method, key: "many"}, ds=None, gpus=0)


def test_lora_dropout_keeps_each_targets_input_once_more():
    """With dropout, LoRA keeps its dropped-out copy of every target's input (s·b·in at 2 bytes) for
    the one layer held in full: the inputs of q, k, v, o, gate, up (8 each) and down (16) sum to 64."""
    config = {**TOY_LORA, "per_device_train_batch_size": 2}
    plain = est.estimate(model_config=TOY, config=config, ds=None, gpus=1)["breakdown"]["activations"]
    dropped = est.estimate(model_config=TOY, config={**config, "lora_dropout": 0.1}, ds=None, gpus=1)
    assert dropped["breakdown"]["activations"] - plain == 2 * 4 * 2 * 64


def test_one_gpu_counts_the_device_runtime_and_the_cpu_its_own():
    e = est.estimate(model_config=TOY, config=TOY_LORA, ds=None, gpus=1, cpu_runtime_bytes=12345)
    assert e["breakdown"]["runtime"] == est.RUNTIME_GPU
    e = est.estimate(model_config=TOY, config=TOY_LORA, ds=None, gpus=0, cpu_runtime_bytes=12345)
    assert e["breakdown"]["runtime"] == 12345


def test_parameter_count_matches_the_real_weights(assets):
    """The tiny demo model: shapes from config.json against the tensors in its safetensors file."""
    model = assets / "demo" / "model"
    with open(model / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    actual = sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    config = json.loads((model / "config.json").read_text())
    assert est.count_params(est.shapes(config))["total"] == actual


def test_published_qwen2_7b_size():
    counts = est.count_params(est.shapes(QWEN2_7B))
    assert counts["total"] == 7_615_616_512  # "7.62B" on the model card
    assert est.trainable_params(SEED_YAML, est.shapes(QWEN2_7B), counts)[0] == 40_370_176


def test_zero3_breakdown_by_hand():
    e = est.estimate(model_config=TOY, config=TOY_LORA, ds=SEED_DS, gpus=2)
    b = e["breakdown"]  # model states: against DeepSpeed itself in test_truth.py
    # Checkpointed: 2 layer inputs 2·s·b·h bytes each + one layer in full 2·s·b·(6h + 16 + 4i) = 1024.
    assert b["activations"] == 2 * 2 * 4 * 8 + 2 * 4 * (6 * 8 + 4 * 4 + 4 * 16)
    assert b["logits"] == 4 * 32 * (2 + 8)
    assert b["buckets"] == int((64 + int(0.9 * 64)) * 2 * 4.5)  # "auto" → h², 0.9·h²; overlap_comm 4.5×
    assert b["runtime"] == est.RUNTIME_GPU
    assert e["per_gpu_bytes"] == sum(b.values())
    no_ckpt = est.estimate(
        model_config=TOY, config={**TOY_LORA, "disable_gradient_checkpointing": True}, ds=SEED_DS, gpus=2
    )
    assert no_ckpt["breakdown"]["activations"] == 2 * 1024 and no_ckpt["gradient_checkpointing"] is False


def test_zero_stage_0_is_plain_training_and_warned_about_on_several_gpus():
    stage0 = {"zero_optimization": {"stage": 0}}
    plain = est.estimate(model_config=TOY, config=TOY_LORA, ds=None, gpus=2)
    zero0 = est.estimate(model_config=TOY, config=TOY_LORA, ds=stage0, gpus=2)
    assert zero0["breakdown"] == plain["breakdown"]
    # LoRA in fp16: the 1736 - 512 frozen weights in 2 bytes, the adapters fp32 with grads and Adam.
    assert plain["breakdown"]["weights_frozen"] == 2 * (1736 - 512)
    assert plain["breakdown"]["optimizer"] == 8 * 512 and plain["warnings"] == []
    assert any("every GPU holds the whole model" in w for w in zero0["warnings"])


def test_zero2_buckets_are_reduce_plus_allgather():
    ds = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 100, "allgather_bucket_size": 50}}
    b = est.estimate(model_config=TOY, config=TOY_LORA, ds=ds, gpus=2)["breakdown"]["buckets"]
    assert b == (100 + 50) * 2  # 16-bit elements; overlap_comm is off by default below ZeRO-3


@pytest.mark.parametrize("key", ["fp16", "bf16", "pure_bf16"])
def test_any_half_precision_switch_halves_the_frozen_weights(key):
    config = {k: v for k, v in TOY_LORA.items() if k != "fp16"}
    e = est.estimate(model_config=TOY, config={**config, key: True}, ds=None, gpus=1)
    assert e["dtype_bytes"] == 2
    assert est.estimate(model_config=TOY, config=config, ds=None, gpus=1)["dtype_bytes"] == 4


def test_plain_training_keeps_fp32_adam_states():
    full = {**TOY_LORA, "finetuning_type": "full"}
    plain = est.estimate(model_config=TOY, config=full, ds=None, gpus=1)["breakdown"]
    assert plain["weights_trainable"] + plain["gradients"] + plain["optimizer"] == 16 * 1736
    assert plain["buckets"] == 0


def test_seed_qwen2_7b_lora_zero3_near_14_gb():
    """The seed: Qwen2-7B, LoRA + ZeRO-3 on MI250 ≈ 14 GB per card; full fine-tune 60 GB+."""
    per = {
        n: est.estimate(model_config=QWEN2_7B, config=SEED_YAML, ds=SEED_DS, gpus=n)["per_gpu_bytes"] / GiB
        for n in (2, 4, 8)
    }
    assert 12 <= per[4] <= 16, per
    assert per[2] > per[4] > per[8]
    full = est.estimate(
        model_config=QWEN2_7B, config={**SEED_YAML, "finetuning_type": "full"}, ds=None, gpus=1
    )
    assert full["per_gpu_bytes"] / GiB > 60


def test_nodes_count_every_rank_zero_shards_over():
    """2 nodes × 4 GPUs shard as 8 GPUs on one node do, not as the 4 of one node (issue 26's 45.1 → 28.0 GB)."""
    full = {**SEED_YAML, "finetuning_type": "full"}
    one_by_four, two_by_four, one_by_eight = (
        est.estimate(model_config=QWEN2_7B, config=full, ds=SEED_DS, gpus=g, nodes=n)
        for n, g in ((1, 4), (2, 4), (1, 8))
    )
    assert two_by_four["per_gpu_bytes"] == one_by_eight["per_gpu_bytes"] < one_by_four["per_gpu_bytes"]
    assert (two_by_four["nodes"], two_by_four["gpus"], two_by_four["ranks"]) == (2, 4, 8)
    # On the CPU a node is one rank: 3 nodes shard as 3 GPUs do.
    cpu = est.estimate(model_config=QWEN2_7B, config=full, ds=SEED_DS, gpus=0, nodes=3)
    three = est.estimate(model_config=QWEN2_7B, config=full, ds=SEED_DS, gpus=3)
    assert cpu["breakdown"]["optimizer"] == three["breakdown"]["optimizer"] and cpu["ranks"] == 3
    # Stage-less DeepSpeed on one GPU a node still replicates the model on every node: warned.
    stage0 = {**SEED_DS, "zero_optimization": {"stage": 0}}
    warned = est.estimate(model_config=QWEN2_7B, config=full, ds=stage0, gpus=1, nodes=2)["warnings"]
    assert any("every GPU holds the whole model" in w for w in warned), warned
    with pytest.raises(est.EstimateError, match="nodes must be 1 or more"):
        est.estimate(model_config=QWEN2_7B, config=full, ds=SEED_DS, gpus=4, nodes=0)


def test_warns_when_it_exceeds_the_device():
    e = est.estimate(model_config=QWEN2_7B, config=SEED_YAML, ds=SEED_DS, gpus=4, device_total_bytes=10 * GiB)
    assert e["fits"] is False and "exceeds the device's 10.0 GiB" in e["warnings"][0]
    e = est.estimate(model_config=QWEN2_7B, config=SEED_YAML, ds=SEED_DS, gpus=4, device_total_bytes=64 * GiB)
    assert e["fits"] is True and e["warnings"] == []


def test_missing_shapes_are_an_error():
    with pytest.raises(est.EstimateError):
        est.estimate(model_config={"model_type": "x"}, config={}, ds=None, gpus=1)


def test_cli_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunedeck.cli.main",
            "estimate",
            str(CONFIGS / "qwen2_lora_sft.yaml"),
            "--gpus",
            "4",
            "--model-config",
            str(tmp_path / "config.json"),
            "--json",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["per_gpu_bytes"] == sum(out["breakdown"].values())
    assert out["zero_stage"] == 3 and out["gpus"] == 4  # the YAML's `deepspeed: ds_z3_rocm` preset was read
    args = [sys.executable, "-m", "tunedeck.cli.main", "estimate", str(CONFIGS / "qwen2_lora_sft.yaml")]
    args += ["--model-config", str(tmp_path / "config.json")]

    def cli(*more: str) -> str:
        r = subprocess.run([*args, *more], check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    across = json.loads(cli("--gpus", "4", "--nodes", "2", "--json"))
    assert across["per_gpu_bytes"] == json.loads(cli("--gpus", "8", "--json"))["per_gpu_bytes"]
    assert across["per_gpu_bytes"] < out["per_gpu_bytes"] and across["ranks"] == 8
    assert "2 nodes × 4 GPU(s): " in cli("--gpus", "4", "--nodes", "2")
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", "estimate", str(CONFIGS / "qwen2_lora_sft.yaml")],
        check=False,
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": ""},
    )
    assert r.returncode == 2 and "--model-config" in r.stderr

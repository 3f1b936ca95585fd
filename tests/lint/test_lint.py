"""Config lint: the seed's own files, crafted bad configs, example-shaped good ones, the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.utils.servers import CONFIGS
from tunedeck.checks import findings, lint, tables

DATA = Path(__file__).parent / "data"
SEED_DS = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())
GFX942x2 = {
    "backend": "rocm",
    "devices": [
        {"index": 0, "name": "MI300X", "arch": "gfx942"},
        {"index": 1, "name": "MI300X", "arch": "gfx942:sramecc+:xnack-"},
    ],
    "packages": {"flash_attn": False},
}


def codes(findings: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in findings:
        out.setdefault(f["code"], []).append(f)
    return out


def seed_with(**zero) -> dict:
    ds = copy.deepcopy(SEED_DS)
    ds["zero_optimization"].update(zero)
    return ds


def test_key_tables_are_captured_from_the_installed_packages():
    assert tables.ds_table()["deepspeed_version"] == "0.19.8"
    zero = tables.ds_table()["models"]["zero_optimization"]
    assert zero["prefetch_bucket_size"]["alias"] == "stage3_prefetch_bucket_size"
    assert "stage3_parition_grads" not in zero and "partition_grads" not in zero
    assert tables.lf_table()["llamafactory_version"] == "0.9.5"


def test_the_seeds_typo_is_an_error_naming_the_key():
    found = codes(lint.lint_deepspeed(seed_with(stage3_parition_grads=True)))
    (f,) = found["DS001"]
    assert f["severity"] == "error"
    assert f["path"] == "deepspeed.zero_optimization.stage3_parition_grads"
    assert "stage3_parition_grads" in f["message"] and "refuses" in f["message"]


def test_the_same_typo_with_auto_is_a_silent_drop_warning():
    found = codes(lint.lint_deepspeed(seed_with(stage3_parition_grads="auto")))
    assert "DS001" not in found
    (f,) = found["DS002"]
    assert f["severity"] == "warning" and "silently" in f["message"]


def test_a_near_miss_gets_the_right_spelling():
    (f,) = codes(lint.lint_deepspeed(seed_with(stage3_max_live_paramters=1e9)))["DS001"]
    assert "stage3_max_live_parameters" in f["fix"]


@pytest.mark.parametrize(
    "pair",
    [
        {
            "prefetch_bucket_size": 5e7
        },  # the seed already has stage3_prefetch_bucket_size ("auto", filled by HF)
        {"gather_16bit_weights_on_model_save": True},
        {"stage3_gather_fp16_weights_on_model_save": True},  # deprecated spelling of the same key
    ],
)
def test_both_spellings_of_an_aliased_key_are_an_error(pair):
    found = codes(lint.lint_deepspeed(seed_with(**pair)))
    (f,) = found["DS003"]
    assert f["severity"] == "error" and f["path"].startswith("deepspeed.zero_optimization.")


def test_deprecated_key_alone_is_a_warning():
    ds = {"zero_optimization": {"stage": 2, "cpu_offload": True}}
    found = codes(lint.lint_deepspeed(ds))
    assert found["DS004"][0]["severity"] == "warning" and "offload_optimizer" in found["DS004"][0]["fix"]
    assert "DS003" not in found


def test_values_and_nested_offload_sections_are_checked():
    ds = {
        "zero_optimization": {
            "stage": 4,
            "overlap_comm": "yes",
            "reduce_bucket_size": -1,
            "offload_optimizer": {"device": "gpu", "pin_memroy": True},
        }
    }
    found = codes(lint.lint_deepspeed(ds))
    paths = {f["path"] for f in found["DS005"]}
    assert {
        "deepspeed.zero_optimization.stage",
        "deepspeed.zero_optimization.overlap_comm",
        "deepspeed.zero_optimization.reduce_bucket_size",
        "deepspeed.zero_optimization.offload_optimizer.device",
    } <= paths
    assert found["DS001"][0]["path"] == "deepspeed.zero_optimization.offload_optimizer.pin_memroy"
    assert "pin_memory" in found["DS001"][0]["fix"]


def test_values_contradicting_the_training_arguments():
    ds = copy.deepcopy(SEED_DS)  # fp16.enabled: true
    ds["train_micro_batch_size_per_gpu"] = 4
    ds["train_batch_size"] = 16
    config = {"bf16": True, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    found = codes(lint.lint_deepspeed(ds, config, gpus=1))
    paths = {f["path"] for f in found["DS006"]}
    assert paths == {
        "deepspeed.fp16.enabled",
        "deepspeed.train_micro_batch_size_per_gpu",
        "deepspeed.train_batch_size",
    }
    assert all(f["severity"] == "error" for f in found["DS006"])
    # The seed's own pairing (fp16 in both) and the CPU test's (fp16 off in both) agree.
    assert "DS006" not in codes(lint.lint_deepspeed(SEED_DS, {"fp16": True}))
    off = copy.deepcopy(SEED_DS)
    off["fp16"]["enabled"] = False
    assert "DS006" not in codes(lint.lint_deepspeed(off, {}))
    # "auto" is filled, never a contradiction.
    assert "DS006" not in codes(
        lint.lint_deepspeed(json.loads((CONFIGS / "ds_z2_rocm.json").read_text()), {"bf16": True}, gpus=8)
    )


def test_overlap_comm_cost_and_save_time_gather_are_noted():
    found = codes(lint.lint_deepspeed(SEED_DS, hidden_size=3584))
    assert found["DS007"][0]["severity"] == "info"
    # 4.5 × (h² + 0.9·h²) elements × 2 bytes = 0.2 GiB for Qwen2-7B's h = 3584
    assert "≈0.2 GiB" in found["DS007"][0]["message"]
    assert found["DS008"][0]["severity"] == "info"
    explicit = codes(
        lint.lint_deepspeed(
            {
                "zero_optimization": {
                    "stage": 2,
                    "overlap_comm": True,
                    "reduce_bucket_size": 2e8,
                    "allgather_bucket_size": 2e8,
                }
            }
        )
    )
    assert "≈3.4 GiB" in explicit["DS007"][0]["message"]  # 4.5 × 4e8 × 2 bytes


def test_llamafactory_keys(tmp_path):
    config = {
        "model_name_or_path": "m",
        "lora_rnak": 8,
        "resources_per_worker": {"GPU": 1},
        "lora_rank": "big",
        "fp16": True,
        "bf16": True,
    }
    found = codes(lint.lint(config))
    assert found["LF001"][0]["path"] == "config.lora_rnak" and "lora_rank" in found["LF001"][0]["fix"]
    assert found["LF002"][0]["path"] == "config.resources_per_worker"
    assert found["LF003"][0]["path"] == "config.lora_rank"
    assert found["LF005"][0]["severity"] == "error"
    assert lint.lint(config)[0]["severity"] == "error"  # errors first


def test_template_must_fit_the_model_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    mc = lint.read_model_config(str(tmp_path))
    (f,) = codes(lint.lint({"template": "llama3"}, model_config=mc))["LF004"]
    assert f["path"] == "config.template" and "qwen" in f["fix"]
    assert "LF004" not in codes(lint.lint({"template": "qwen"}, model_config=mc))
    assert "LF004" not in codes(lint.lint({"template": "llama3", "stage": "pt"}, model_config=mc))


def test_reused_output_dir(tmp_path):
    (tmp_path / "trainer_log.jsonl").write_text("{}\n")
    assert codes(lint.lint({}, output_dir=tmp_path))["LF006"][0]["severity"] == "warning"
    assert "LF006" not in codes(lint.lint({"overwrite_output_dir": True}, output_dir=tmp_path))


def test_hardware_checks_use_the_nodes_preflight():
    config = {"fp16": True}
    found = codes(
        lint.lint(config, gpus=4, preflight=GFX942x2)
        + lint.lint({"flash_attn": "fa2"}, gpus=2, preflight=GFX942x2)
    )
    assert found["HW001"][0]["path"] == "config.fp16" and "bf16" in found["HW001"][0]["fix"]
    assert found["HW002"][0]["path"] == "config.ddp_timeout"
    assert found["HW003"][0]["severity"] == "error" and "2" in found["HW003"][0]["message"]
    assert found["HW004"][0]["path"] == "config.flash_attn"
    assert "HW002" not in codes(lint.lint({"ddp_timeout": 180000000}, gpus=2, preflight=GFX942x2))
    # The same config on this CPU node, or without a preflight: hardware checks do not fire.
    cpu = {"backend": "cpu", "devices": [], "packages": {}}
    assert not [
        f
        for f in lint.lint(config, gpus=0, preflight=cpu) + lint.lint(config, gpus=4)
        if f["code"].startswith("HW")
    ]


def test_presets_lint_without_errors():
    for path in sorted(p for p in CONFIGS.iterdir() if p.suffix in (".yaml", ".yml", ".json")):
        errors = [f for f in lint.lint_file(path) if f["severity"] == "error"]
        assert errors == [], (path.name, errors)
    demo = lint.lint_file(CONFIGS / "demo_cpu.yaml")
    assert [f for f in demo if f["severity"] != "info"] == []


def test_example_shaped_configs_have_no_false_errors(monkeypatch):
    monkeypatch.chdir(DATA)  # LLaMA-Factory runs examples from its repository root
    files = [
        DATA / "llama3_lora_sft_ds3.yaml",
        DATA / "qwen2_full_sft.yaml",
        *sorted((DATA / "examples" / "deepspeed").glob("*.json")),
    ]
    for path in files:
        findings = lint.lint_file(path)
        assert [f for f in findings if f["severity"] == "error"] == [], path.name
        assert "DS009" not in codes(findings), path.name  # the DeepSpeed file was found and checked


def test_old_ray_keys_are_removed_keys():
    found = codes(lint.lint_file(DATA / "ray_old_keys.yaml"))
    assert {f["path"] for f in found["LF002"]} == {"config.resources_per_worker", "config.ray_storage_path"}


def test_as_error_locates_the_key():
    f = codes(lint.lint_deepspeed(seed_with(stage3_parition_grads=True)))["DS001"][0]
    err = findings.as_error(f)
    assert err["loc"] == ["deepspeed", "zero_optimization", "stage3_parition_grads"]
    assert err["type"] == "lint_error" and err["code"] == "DS001"
    assert err["msg"].startswith("DS001: ") and " — fix: " in err["msg"]


def test_cli(tmp_path):
    bad = tmp_path / "ds_seed_original.json"
    bad.write_text(json.dumps(seed_with(stage3_parition_grads=True)))
    good = CONFIGS / "qwen2_lora_sft.yaml"
    cli = [sys.executable, "-m", "tunedeck.cli.main", "lint"]
    r = subprocess.run([*cli, str(bad), str(good)], check=False, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "DS001 deepspeed.zero_optimization.stage3_parition_grads" in r.stdout
    assert "2 file(s): 1 error(s)" in r.stdout
    r = subprocess.run([*cli, "--json", str(good)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert all(f["severity"] != "error" for f in json.loads(r.stdout)[str(good)])
    assert yaml.safe_load(good.read_text())["deepspeed"] == "ds_z3_rocm"


def test_cli_checks_dataset_names_where_the_run_would_read_them(tmp_path):
    """As LLaMA-Factory does: `dataset_dir` (default `data`) from the folder the run starts in."""
    config = yaml.safe_load((CONFIGS / "qwen2_lora_sft.yaml").read_text())
    config.pop("deepspeed", None)
    config.update(dataset="alpaca_en_demo,alpaca_zh_dem", dataset_dir="data")
    file = tmp_path / "train.yaml"
    file.write_text(yaml.safe_dump(config))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text(
        json.dumps({"alpaca_en_demo": {"file_name": "a.json"}, "alpaca_zh_demo": {"file_name": "z.json"}})
    )
    cli = [sys.executable, "-m", "tunedeck.cli.main", "lint", "--json", str(file)]
    r = subprocess.run(cli, check=False, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    (f,) = [f for f in json.loads(r.stdout)[str(file)] if f["code"] == "LF014"]
    assert (
        f["path"] == "config.dataset" and "'alpaca_zh_dem'" in f["message"] and "alpaca_zh_demo" in f["fix"]
    )
    config["dataset"] = "alpaca_en_demo,alpaca_zh_demo"
    file.write_text(yaml.safe_dump(config))
    r = subprocess.run(cli, check=False, capture_output=True, text=True, cwd=tmp_path)
    assert not [f for f in json.loads(r.stdout)[str(file)] if f["code"] in ("LF014", "LF015", "LF019")], (
        r.stdout
    )


def test_yamls_that_are_not_train_configs_are_skipped(tmp_path):
    files = {
        "accelerate.yaml": {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "FSDP",
            "num_processes": 2,
        },
        "v1.yaml": {"model": "Qwen/Qwen3-0.6B", "dist_config": {"name": "fsdp2"}, "micro_batch_size": 1},
        "tokens.yaml": {"<|start_of_svg|>": "svg start"},
    }
    for name, content in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(content))
        (f,) = lint.lint_file(tmp_path / name)
        assert (f["code"], f["severity"]) == ("LF008", "info"), name
    mca = {
        "model_name_or_path": "Qwen/Qwen3-30B-A3B",
        "stage": "sft",
        "tensor_model_parallel_size": 2,
        "moe_grouped_gemm": True,
        "lora_rnak": 8,
    }
    found = codes(lint.lint(mca))
    assert found["LF007"][0]["severity"] == "info"
    assert "LF001" not in found  # mcore_adapter's keys (and anything else unknown) are its business


def test_flat_fsdp_keys_point_to_fsdp_config():
    (f,) = codes(
        lint.lint({"fsdp": ["full_shard"], "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})
    )["LF001"]
    assert "fsdp_config" in f["fix"] and "transformer_layer_cls_to_wrap" in f["fix"]


def test_value_ranges_cover_every_numeric_key_and_keep_the_defaults():
    """Every int key of the table must fit 64 bits and every float key be finite; the documented ranges
    name numeric keys of the table (an upstream rename fails here) and accept LLaMA-Factory's defaults."""
    args = tables.lf_table()["args"]
    for key, info in args.items():
        bad = {"int": 2**63, "float": float("nan")}.get(info["type"])
        if bad is not None:
            assert [f["code"] for f in lint.lint_lf_keys({key: bad})] == ["LF003"], key
            if info.get("default") is not None:
                assert lint.lint_lf_keys({key: info["default"]}) == [], key
    for key, span in lint.RANGES.items():
        assert args[key]["type"] in ("int", "float"), key
        if span.low is not None:
            below = span.low if span.low_open else span.low - 1
            (f,) = lint.lint_lf_keys({key: below})
            assert f["code"] == "LF003" and f["path"] == f"config.{key}", key
            assert lint.lint_lf_keys({key: span.low + 1 if span.low_open else span.low}) == [], key
    assert lint.lint_lf_keys({"learning_rate": "5e-5", "max_steps": "-1", "num_train_epochs": 3.0}) == []
    assert "finite" in lint.lint_lf_keys({"learning_rate": "Infinity"})[0]["message"]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"finetuning_type": "lora", "learning_rate": 1e8}, "far above"),
        ({"learning_rate": "1e8"}, "far above"),  # LoRA is LLaMA-Factory's default; YAML's 1e8 is a string
        ({"finetuning_type": "full", "learning_rate": 5e-3}, "far above"),  # fine for LoRA, not for full
        ({"finetuning_type": "full", "learning_rate": 1e-10}, "far below"),
        ({"finetuning_type": "lora", "learning_rate": 0}, "trains nothing"),
    ],
)
def test_a_learning_rate_far_outside_its_finetuning_types_range_is_a_warning(config, said):
    (f,) = codes(lint.lint(config))["LF020"]
    assert f["severity"] == "warning" and f["path"] == "config.learning_rate"
    assert said in f["message"] and "usually" in f["message"], f
    assert "within" in f["fix"]


@pytest.mark.parametrize(
    "config",
    [
        {"finetuning_type": "lora", "learning_rate": 1e-4},  # the seed's own
        {"finetuning_type": "lora", "learning_rate": 5e-3},  # the CPU demo's, for a tiny model
        {"finetuning_type": "lora", "learning_rate": 5e-6},  # LLaMA-Factory's LoRA DPO example
        {"finetuning_type": "full", "learning_rate": 1e-5},
        {"finetuning_type": "freeze"},  # transformers' default, 5e-5
    ],
)
def test_usual_learning_rates_are_not_flagged(config):
    assert "LF020" not in codes(lint.lint(config))

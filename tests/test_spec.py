"""Job spec validation and rendering, against the captured LLaMA-Factory argument table."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.utils.toy_model import TOY_QWEN2
from tunedeck.checks.spec import launch_env, spec_from_yaml
from tunedeck.checks.submission import Node, Submission, resolve
from tunedeck.checks.tables import lf_table as lf_args
from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.schemas import JobSpec


def prepare(spec: JobSpec, *, settings: Settings, node_gpus: int) -> Submission:
    """A spec through the submission pipeline as a submit takes it: refused with every error."""
    return resolve(spec, settings, Node(gpus=node_gpus)).checked()


@pytest.fixture
def settings(tmp_path):
    (tmp_path / "ws" / "models" / "m").mkdir(parents=True)
    (tmp_path / "ws" / "data").mkdir()  # where the specs' dataset "d" is defined (LF015 otherwise)
    (tmp_path / "ws" / "data" / "dataset_info.json").write_text('{"d": {"file_name": "d.json"}}')
    return Settings(workspace=tmp_path / "ws")


def spec(**config) -> JobSpec:
    base = {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen", "finetuning_type": "lora"}
    return JobSpec(name="t", config={**base, **config})


def errors(fn) -> list[dict]:
    with pytest.raises(SpecError) as e:
        fn()
    return e.value.errors


def test_table_is_llamafactory_0_9_5():
    table = lf_args()
    assert table["llamafactory_version"] == "0.9.5"
    for key in ("model_name_or_path", "lora_rank", "deepspeed", "learning_rate", "ray_num_workers"):
        assert key in table["args"]
    assert "resources_per_worker" in table["removed"]


def test_unknown_key_is_named_with_a_suggestion(settings):
    errs = errors(lambda: prepare(spec(lora_rnak=8), settings=settings, node_gpus=0))
    assert errs[0]["loc"] == ["config", "lora_rnak"]
    assert "lora_rank" in errs[0]["msg"]


def test_removed_and_wrongly_typed_keys(settings):
    errs = errors(
        lambda: prepare(
            spec(resources_per_worker={"GPU": 1}, lora_rank="big", bf16="maybe"),
            settings=settings,
            node_gpus=0,
        )
    )
    by_key = {e["loc"][1]: e["msg"] for e in errs}
    assert "no longer accepted" in by_key["resources_per_worker"]
    assert "integer" in by_key["lora_rank"]
    assert "true or false" in by_key["bf16"]


def test_yaml_float_strings_are_numbers(settings):
    # YAML 1.1 reads 5e-3 (no dot) as a string; LLaMA-Factory's parser takes it as a float.
    # The train.yaml we write is read the way LLaMA-Factory reads it (OmegaConf), which must see a number.
    omegaconf = pytest.importorskip("omegaconf")
    prepared = prepare(spec(learning_rate="5e-3"), settings=settings, node_gpus=0)
    train_yaml, _ = prepared.render(run_dir=settings.workspace / "run")
    loaded = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(train_yaml))
    assert loaded["learning_rate"] == 0.005 and isinstance(loaded["learning_rate"], float)


def test_paths_are_confined(settings, tmp_path):
    (tmp_path / "outside").mkdir()
    for bad in (str(tmp_path / "outside"), "../outside", "models/../../outside"):
        errs = errors(lambda bad=bad: prepare(spec(model_name_or_path=bad), settings=settings, node_gpus=0))
        assert errs[0]["loc"] == ["config", "model_name_or_path"], bad
    # A symlink inside the workspace that points out is refused too.
    os.symlink(tmp_path / "outside", settings.workspace / "link")
    errs = errors(lambda: prepare(spec(dataset_dir="link"), settings=settings, node_gpus=0))
    assert errs[0]["loc"] == ["config", "dataset_dir"]


def test_relative_paths_resolve_in_workspace_and_hub_ids_pass(settings, tmp_path, monkeypatch):
    p = prepare(spec(), settings=settings, node_gpus=0)
    assert p.config["model_name_or_path"] == str(settings.workspace / "models" / "m")
    assert p.config["dataset_dir"] == str(settings.workspace / "data")
    # A hub id passes when it is in the local cache (runs are offline: tests/security/test_reach.py).
    snap = tmp_path / "hub" / "models--Qwen--Qwen2-7B-Instruct" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    p = prepare(spec(model_name_or_path="Qwen/Qwen2-7B-Instruct"), settings=settings, node_gpus=0)
    assert p.config["model_name_or_path"] == "Qwen/Qwen2-7B-Instruct"


def test_forced_keys_and_output_dir(settings, tmp_path):
    p = prepare(spec(output_dir="saves/x", overwrite_output_dir=False), settings=settings, node_gpus=0)
    assert p.config["overwrite_output_dir"] is True and p.config["include_num_input_tokens_seen"] is True
    assert any("output_dir" in w for w in p.warnings)
    text, ds = p.render(run_dir=tmp_path / "run")
    assert yaml.safe_load(text)["output_dir"] == str(tmp_path / "run" / "output")
    assert ds is None


def test_gpus_against_the_node(settings):
    assert prepare(spec(), settings=settings, node_gpus=0).gpus == 0
    assert prepare(spec(), settings=settings, node_gpus=4).gpus == 1
    errs = errors(
        lambda: prepare(JobSpec(name="t", config=spec().config, gpus=2), settings=settings, node_gpus=1)
    )
    assert errs[0]["loc"] == ["gpus"] and "has 1" in errs[0]["msg"]


def test_deepspeed_preset_inline_and_yaml_path(settings, tmp_path):
    fp16 = spec(fp16=True).config  # the preset's fp16.enabled: true must agree with the training arguments
    p = prepare(JobSpec(name="t", config=fp16, deepspeed="ds_z3_rocm"), settings=settings, node_gpus=0)
    assert p.ds_config["zero_optimization"]["stage"] == 3
    text, ds = p.render(run_dir=tmp_path)
    assert yaml.safe_load(text)["deepspeed"] == str(tmp_path / "ds_config.json")
    assert json.loads(ds) == p.ds_config
    errs = errors(
        lambda: prepare(
            JobSpec(name="t", config=spec().config, deepspeed="nope"), settings=settings, node_gpus=0
        )
    )
    assert errs[0]["loc"] == ["deepspeed"]
    # A LLaMA-Factory YAML names its DeepSpeed file with a path; ours is used when the stem matches.
    s = spec_from_yaml(yaml.safe_dump({**fp16, "deepspeed": "examples/deepspeed/ds_z3_rocm.json"}), name="y")
    p = prepare(s, settings=settings, node_gpus=0)
    assert p.ds_config["zero_optimization"]["stage"] == 3


def test_launch_env():
    assert launch_env(gpus=0, devices=[], deepspeed=False)["CUDA_VISIBLE_DEVICES"] == ""
    env = launch_env(gpus=2, devices=[2, 3], deepspeed=False)
    assert (
        env["HIP_VISIBLE_DEVICES"] == "2,3" and env["NPROC_PER_NODE"] == "2" and env["FORCE_TORCHRUN"] == "1"
    )
    assert launch_env(gpus=0, devices=[], deepspeed=True)["NPROC_PER_NODE"] == "1"
    assert "FORCE_TORCHRUN" not in launch_env(gpus=1, devices=[0], deepspeed=False)


def test_bad_yaml_is_a_clear_error():
    errs = errors(lambda: spec_from_yaml("a: [", name="x"))
    assert errs[0]["loc"] == ["config"] and "YAML" in errs[0]["msg"]
    errs = errors(lambda: spec_from_yaml("- a\n- b\n", name="x"))
    assert "mapping" in errs[0]["msg"]


def test_yaml_keys_that_are_not_strings_are_named():
    # Found by the fuzzer: `1: x` built a JobSpec with an int key and answered 500.
    errs = errors(lambda: spec_from_yaml("learning_rate: 1.0e-4\n1: 2\nnull: 3\n", name="x"))
    assert [e["loc"] for e in errs] == [["config", "1"], ["config", "None"]]
    assert all("not a name" in e["msg"] and e["type"] == "value_error" for e in errs)


def test_the_model_config_is_read_only_inside_the_roots(settings, tmp_path):
    (settings.workspace / "models" / "m" / "config.json").write_text(json.dumps(TOY_QWEN2))
    p = resolve(spec(), settings, Node())
    assert p.model_config == TOY_QWEN2 and p.estimate["params"] > 0
    outside = tmp_path / "outside" / "m"
    outside.mkdir(parents=True)
    (outside / "config.json").write_text(json.dumps(TOY_QWEN2))
    p = resolve(spec(model_name_or_path=str(outside)), settings, Node())
    assert p.model_config is None and p.estimate is None  # never read, however readable
    assert ["config", "model_name_or_path"] in [e["loc"] for e in p.errors]
    (settings.workspace / "models" / "m" / "config.json").write_text("[1, 2]")
    assert resolve(spec(), settings, Node()).model_config is None  # not a model config
    for odd in (5, ["models/m"], ""):  # refused at the key, never an exception
        p = resolve(spec(model_name_or_path=odd), settings, Node())
        assert p.model_config is None and p.estimate is None, odd


def test_deepspeed_files_are_json_files_inside_the_roots(settings, tmp_path):
    zero2 = {"zero_optimization": {"stage": 2}}
    (settings.workspace / "ds").mkdir()
    for name, text in {"z2.json": zero2, "z2": zero2, "list.json": [zero2]}.items():
        (settings.workspace / "ds" / name).write_text(json.dumps(text))
    (settings.workspace / "ds" / "broken.json").write_text("{")
    (tmp_path / "z2.json").write_text(json.dumps(zero2))

    def ds(value: str) -> Submission:
        return resolve(JobSpec(name="t", config=spec().config, deepspeed=value), settings, Node())

    assert ds("ds/z2.json").ds_config == zero2
    assert ds(str(settings.workspace / "ds" / "z2.json")).ds_config == zero2
    for value, why in (
        ("ds/z2", "neither a DeepSpeed preset"),  # a config file is named *.json
        (str(tmp_path / "z2.json"), "inside the allowed roots"),
        ("ds/../../z2.json", "inside the allowed roots"),
        ("ds/list.json", "must hold a JSON object"),
        ("ds/broken.json", "not valid JSON"),
    ):
        p = ds(value)
        (e,) = [e for e in p.errors if e["loc"] == ["deepspeed"]]
        assert p.ds_config is None and why in e["msg"], (value, e)

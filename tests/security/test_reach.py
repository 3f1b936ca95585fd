"""What a submitted job may reach beyond its run folder: every path-valued key of the captured
tables is confined, network keys and hub ids need a setting, remote code is refused unless allowed.
The keys the trainer writes: tests/security/test_writes.py; pickles: tests/security/test_pickles.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import secrets
import sqlite3
from pathlib import Path

import psutil
import pytest
import yaml

from tests.utils.datasets import add_dataset
from tests.utils.servers import CONFIGS, demo_config
from tests.utils.wait import until
from tunedeck.checks import reach
from tunedeck.checks.spec import launch_env, spec_from_yaml
from tunedeck.checks.submission import Node, Submission, resolve
from tunedeck.checks.tables import lf_table
from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.schemas import JobSpec

# The keys a hostile teammate used in the reports: the table walk must find at least these.
REPORTED_LF = {
    "profiler_output_dir",
    "offload_folder",
    "export_dir",
    "swanlab_logdir",
    "adapter_folder",
    "ref_model_adapters",
    "new_special_tokens_config",
    "hyper_parallel_args",
    "fsdp_config",
    "accelerator_config",
    "model_name_or_path",
    "dataset_dir",
    "tokenized_path",
    "cache_dir",
}
REPORTED_DS = {
    ("zero_optimization", "offload_param", "nvme_path"),
    ("zero_optimization", "offload_optimizer", "nvme_path"),
    ("flops_profiler", "output_file"),
    ("tensorboard", "output_path"),
    ("csv_monitor", "output_path"),
}


def prepare(spec: JobSpec, *, settings: Settings, node_gpus: int) -> Submission:
    """A spec through the submission pipeline as a submit takes it: refused with every error."""
    return resolve(spec, settings, Node(gpus=node_gpus)).checked()


def lint_spec(spec: JobSpec, *, settings: Settings) -> list[dict]:
    return resolve(spec, settings, Node()).findings


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))  # an empty cache of our own
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    (tmp_path / "ws" / "models" / "m").mkdir(parents=True)
    add_dataset(tmp_path / "ws" / "data")  # the "d" every spec names
    (tmp_path / "outside").mkdir()
    return tmp_path / "ws"


def settings(ws: Path, **kw) -> Settings:
    return Settings(workspace=ws, **kw)


def spec(**config) -> JobSpec:
    base = {"model_name_or_path": "models/m", "dataset": "d", "template": "qwen", "finetuning_type": "lora"}
    return JobSpec(name="t", config={**base, **config})


def errors(fn) -> dict[tuple, dict]:
    with pytest.raises(SpecError) as e:
        fn()
    return {tuple(x["loc"]): x for x in e.value.errors}


def cached(cache: Path, repo: str, kind: str = "model", **files: str) -> Path:
    """A snapshot in a Hugging Face hub cache laid out as huggingface_hub writes it."""
    repo_dir = cache / f"{kind}s--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snap / name.replace("__", ".")).write_text(text)
    return snap


QWEN2 = json.dumps(
    {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
    }
)
AUTO_MAP = json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}})


# ---------------------------------------------------------------- paths


def test_the_table_walk_finds_the_reported_keys():
    lf, ds = set(reach.lf_path_keys()), set(reach.ds_path_keys())
    assert REPORTED_LF <= lf, REPORTED_LF - lf
    assert REPORTED_DS <= ds, REPORTED_DS - ds
    # Every key found is a real argument / section key, and no plain number or switch is among them.
    args = lf_table()["args"]
    assert all(args[k]["type"] in ("str", "dict", "any", "list") for k in lf)


@pytest.mark.parametrize("key", sorted(set(reach.lf_path_keys()) - set(reach.lf_write_keys())))
def test_every_path_key_the_trainer_reads_is_confined(ws, tmp_path, key):
    s = settings(ws)
    outside, inside = tmp_path / "outside" / key, ws / "in" / key
    if key == "output_dir":  # tunedeck's own: whatever is given, the run gets a fresh folder inside
        p = prepare(spec(output_dir=str(outside)), settings=s, node_gpus=0)
        text, _ = p.render(run_dir=ws / "runs" / "1")
        assert yaml.safe_load(text)["output_dir"] == str(ws / "runs" / "1" / "output")
        return
    if key == "deepspeed":
        inside = inside.with_suffix(".json")
        inside.parent.mkdir(parents=True)
        inside.write_text("{}")
        errs = errors(lambda: prepare(spec(deepspeed=str(outside) + ".json"), settings=s, node_gpus=0))
        assert ("deepspeed",) in errs
        assert prepare(spec(deepspeed=str(inside)), settings=s, node_gpus=0).ds_config == {}
        return
    errs = errors(lambda: prepare(spec(**{key: str(outside)}), settings=s, node_gpus=0))
    assert ("config", key) in errs, errs
    assert "outside the allowed roots" in errs[("config", key)]["msg"]
    errs = errors(lambda: prepare(spec(**{key: f"in/../../outside/{key}"}), settings=s, node_gpus=0))
    assert ("config", key) in errs, errs
    if reach.lf_path_keys()[key].hub:  # what the run loads (model, adapter, dataset) must be there
        errs = errors(lambda: prepare(spec(**{key: str(inside)}), settings=s, node_gpus=0))
        assert "does not exist" in errs[("config", key)]["msg"], errs
        inside.mkdir(parents=True)
    if key == "dataset_dir":  # a dataset folder the spec's dataset is in
        add_dataset(inside)
    if reach.lf_pickle_keys().get(key) == "checkpoint":  # one that does not exist yet cannot be checked
        inside.mkdir(parents=True)
    p = prepare(spec(**{key: str(ws / "in" / "." / key)}), settings=s, node_gpus=0)
    assert p.config[key] == str(inside)
    text, _ = p.render(run_dir=ws / "o")
    assert yaml.safe_load(text)[key] == str(inside)


def test_the_reported_profiler_escape_is_refused(ws, tmp_path):
    errs = errors(
        lambda: prepare(
            spec(enable_torch_profiler=True, profiler_output_dir=str(tmp_path / "outside")),
            settings=settings(ws),
            node_gpus=0,
        )
    )
    assert list(errs) == [("config", "profiler_output_dir")]


def test_relative_paths_resolve_in_the_workspace_and_subfolders_stay_relative(ws):
    p = prepare(
        spec(media_dir="media", adapter_name_or_path="models/m", adapter_folder="sub"),
        settings=settings(ws),
        node_gpus=0,
    )
    assert p.config["media_dir"] == str(ws / "media")
    assert p.config["adapter_folder"] == "sub"  # LLaMA-Factory joins it onto the adapter's folder
    errs = errors(
        lambda: prepare(
            spec(adapter_name_or_path="models/m", adapter_folder="../../../outside"),
            settings=settings(ws),
            node_gpus=0,
        )
    )
    assert ("config", "adapter_folder") in errs


def test_comma_lists_are_confined_part_by_part(ws, tmp_path):
    errs = errors(
        lambda: prepare(
            spec(ref_model_adapters=f"models/m,{tmp_path / 'outside'}"), settings=settings(ws), node_gpus=0
        )
    )
    assert ("config", "ref_model_adapters") in errs
    p = prepare(spec(adapter_name_or_path="models/m, models/m"), settings=settings(ws), node_gpus=0)
    assert p.config["adapter_name_or_path"] == f"{ws / 'models' / 'm'},{ws / 'models' / 'm'}"


def test_paths_inside_dict_valued_keys_are_confined(ws, tmp_path):
    errs = errors(
        lambda: prepare(
            spec(vllm_config={"download_dir": str(tmp_path / "outside")}), settings=settings(ws), node_gpus=0
        )
    )
    assert ("config", "vllm_config", "download_dir") in errs
    # transformers reads a dict-typed argument given as JSON text as that JSON.
    for key in ("fsdp_config", "vllm_config"):
        errs = errors(
            lambda key=key: prepare(
                spec(**{key: json.dumps({"x_dir": str(tmp_path / "outside")})}),
                settings=settings(ws),
                node_gpus=0,
            )
        )
        assert ("config", key, "x_dir") in errs
    errs = errors(lambda: prepare(spec(cache_dir=3), settings=settings(ws), node_gpus=0))
    assert ("config", "cache_dir") in errs


def test_deepspeed_paths_outside_the_table_are_found_by_name(ws, tmp_path):
    ds = {
        "data_efficiency": {
            "data_sampling": {
                "curriculum_learning": {
                    "curriculum_metrics": {"seqlen": {"index_to_sample_path": str(tmp_path / "outside")}}
                }
            }
        }
    }
    errs = errors(
        lambda: prepare(
            JobSpec(name="t", config=spec().config, deepspeed=ds), settings=settings(ws), node_gpus=0
        )
    )
    assert (
        "deepspeed",
        "data_efficiency",
        "data_sampling",
        "curriculum_learning",
        "curriculum_metrics",
        "seqlen",
        "index_to_sample_path",
    ) in errs


def test_keys_before_a_path_key_do_not_end_the_check(ws, tmp_path):
    """tunedeck's own keys and null values are passed over, not taken as the end of the config."""
    outside = str(tmp_path / "outside")
    for first in ({"output_dir": "anything"}, {"tokenized_path": None}):
        errs = errors(
            lambda first=first: prepare(spec(**first, export_dir=outside), settings=settings(ws), node_gpus=0)
        )
        assert ("config", "export_dir") in errs, first


def test_only_dataset_dir_takes_online_and_remote(ws):
    """`ONLINE` names a hub mode for dataset_dir alone; for any other path key it is a folder name."""
    p = prepare(spec(media_dir="ONLINE", tokenized_path="REMOTE:org/set"), settings=settings(ws), node_gpus=0)
    assert p.config["media_dir"] == str(ws / "ONLINE")
    text, _ = p.render(run_dir=ws / "runs" / "000001-t")  # written, so in the job's run folder
    assert yaml.safe_load(text)["tokenized_path"] == str(ws / "runs" / "000001-t" / "REMOTE:org" / "set")


def test_the_cached_key_tables_cannot_be_changed_by_a_check():
    key = next(iter(reach.lf_path_keys().values()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.hub = not key.hub  # shared by every later check (lru_cache)


def test_the_submitted_spec_is_not_rewritten(ws):
    ds = {"tensorboard": {"enabled": True, "output_path": "tb"}}
    s = JobSpec(name="t", config=spec(offload_folder="off").config, deepspeed=ds)
    prepare(s, settings=settings(ws), node_gpus=0)
    assert s.config["offload_folder"] == "off" and s.deepspeed["tensorboard"]["output_path"] == "tb"


# ---------------------------------------------------------------- dataset_dir: ONLINE


def test_online_datasets_given_as_paths_are_confined(ws, tmp_path):
    s = settings(ws)
    for key in ("dataset", "eval_dataset"):
        for bad in (str(tmp_path / "outside"), "../outside", f"d,{tmp_path / 'outside'}"):
            errs = errors(
                lambda bad=bad, key=key: prepare(
                    spec(dataset_dir="ONLINE", **{key: bad}), settings=s, node_gpus=0
                )
            )
            assert ("config", key) in errs, (key, bad, errs)
    (ws / "sets" / "mine").mkdir(parents=True)
    p = prepare(spec(dataset_dir="ONLINE", dataset=str(ws / "sets" / "mine")), settings=s, node_gpus=0)
    assert p.config["dataset"] == str(ws / "sets" / "mine") and p.config["dataset_dir"] == "ONLINE"
    p = prepare(spec(dataset_dir="ONLINE", dataset="sets/mine"), settings=s, node_gpus=0)
    assert p.config["dataset"] == str(ws / "sets" / "mine")  # a workspace folder wins over the hub


def test_online_hub_datasets_must_be_in_the_cache(ws, tmp_path):
    errs = errors(
        lambda: prepare(spec(dataset_dir="ONLINE", dataset="org/set"), settings=settings(ws), node_gpus=0)
    )
    e = errs[("config", "dataset")]
    assert e["code"] == "LF013" and "TUNEDECK_ALLOW_HUB" in e["msg"]
    cached(tmp_path / "hf" / "hub", "org/set", kind="dataset", data__json="[]")
    p = prepare(spec(dataset_dir="ONLINE", dataset="org/set"), settings=settings(ws), node_gpus=0)
    assert p.config["dataset"] == "org/set"
    assert (
        prepare(
            spec(dataset_dir="ONLINE", dataset="other/set"),
            settings=settings(ws, allow_hub=True),
            node_gpus=0,
        ).config["dataset"]
        == "other/set"
    )
    errs = errors(lambda: prepare(spec(dataset_dir="REMOTE:org/nowhere"), settings=settings(ws), node_gpus=0))
    assert errs[("config", "dataset_dir")]["code"] == "LF013"


# ---------------------------------------------------------------- network keys and the hub


NETWORK = [
    ("push_to_hub", True),
    ("hub_model_id", "me/model"),
    ("hub_token", "hf_x"),
    ("hf_hub_token", "hf_x"),
    ("export_hub_model_id", "me/merged"),
    ("use_swanlab", True),
    ("swanlab_api_key", "k"),
    ("report_to", "wandb"),
    ("report_to", ["tensorboard", "mlflow"]),
    ("report_to", "all"),
    ("generation_config", "https://example.com/gen.json"),
    ("reward_model", "http://127.0.0.1:9/score"),
]


@pytest.mark.parametrize(("key", "value"), NETWORK, ids=[f"{k}={v}" for k, v in NETWORK])
def test_network_keys_need_the_setting(ws, key, value):
    errs = errors(lambda: prepare(spec(**{key: value}), settings=settings(ws), node_gpus=0))
    e = errs[("config", key)]
    assert e["code"] == "LF012" and "TUNEDECK_ALLOW_NETWORK_KEYS" in e["msg"], e
    assert f"fix: remove `{key}`" in e["msg"]  # the fix names the key, not the section it sits in
    allowed = settings(ws, allow_network_keys=True, allow_hub=True)
    assert prepare(spec(**{key: value}), settings=allowed, node_gpus=0).config[key] == value


def test_a_url_is_named_by_its_scheme_alone(ws):
    """The message says what kind of address it is without echoing the address (it may carry a key)."""
    url = "https://user:secret@example.com/gen.json"
    errs = errors(lambda: prepare(spec(generation_config=url), settings=settings(ws), node_gpus=0))
    msg = errs[("config", "generation_config")]["msg"]
    assert "`generation_config` is a URL (https://...)" in msg and "secret" not in msg


def test_every_network_key_of_the_table_is_refused(ws):
    args = lf_table()["args"]
    assert {"push_to_hub", "hub_token", "hub_model_id", "use_swanlab"} <= set(reach.lf_network_keys())
    for key in reach.lf_network_keys():
        value = True if args[key]["type"] == "bool" else "x-not-the-default"
        errs = errors(
            lambda key=key, value=value: prepare(spec(**{key: value}), settings=settings(ws), node_gpus=0)
        )
        assert errs[("config", key)]["code"] == "LF012", key


def test_a_switch_written_as_text_is_read_as_llamafactory_reads_it(ws):
    """`use_swanlab: "false"` is off (HfArgumentParser reads the text as a bool), so it needs no setting."""
    prepare(spec(use_swanlab="false"), settings=settings(ws), node_gpus=0)
    errs = errors(lambda: prepare(spec(use_swanlab="true"), settings=settings(ws), node_gpus=0))
    assert errs[("config", "use_swanlab")]["code"] == "LF012"


def test_local_reporting_and_local_modes_pass(ws):
    for value in ("none", "tensorboard", ["none"], "tensorboard,none"):
        prepare(spec(report_to=value), settings=settings(ws), node_gpus=0)
    prepare(
        spec(use_swanlab=True, swanlab_mode="local", swanlab_logdir="sw"), settings=settings(ws), node_gpus=0
    )


def test_push_to_hub_also_needs_the_hub(ws):
    errs = errors(
        lambda: prepare(spec(push_to_hub=True), settings=settings(ws, allow_network_keys=True), node_gpus=0)
    )
    assert "TUNEDECK_ALLOW_HUB" in errs[("config", "push_to_hub")]["msg"]


@pytest.mark.parametrize("section", reach.ds_remote_monitors())
def test_deepspeed_monitors_that_send_out_need_the_setting(ws, section):
    ds = {section: {"enabled": True}}
    errs = errors(
        lambda: prepare(
            JobSpec(name="t", config=spec().config, deepspeed=ds), settings=settings(ws), node_gpus=0
        )
    )
    assert errs[("deepspeed", section, "enabled")]["code"] == "DS010"
    assert "fix: remove `enabled`" in errs[("deepspeed", section, "enabled")]["msg"]
    prepare(
        JobSpec(name="t", config=spec().config, deepspeed=ds),
        settings=settings(ws, allow_network_keys=True),
        node_gpus=0,
    )
    prepare(
        JobSpec(name="t", config=spec().config, deepspeed={"tensorboard": {"enabled": True}}),
        settings=settings(ws),
        node_gpus=0,
    )


def test_hub_models_must_be_in_the_cache_while_runs_are_offline(ws, tmp_path):
    errs = errors(
        lambda: prepare(spec(model_name_or_path="Qwen/Qwen2-7B-Instruct"), settings=settings(ws), node_gpus=0)
    )
    e = errs[("config", "model_name_or_path")]
    assert e["code"] == "LF013" and "TUNEDECK_ALLOW_HUB" in e["msg"]
    # The fix downloads into a workspace folder named after the repository, not its owner.
    assert (
        f"hf download Qwen/Qwen2-7B-Instruct --local-dir {ws / 'models' / 'Qwen2-7B-Instruct'}`" in e["msg"]
    )
    errs = errors(lambda: prepare(spec(dataset_dir="REMOTE:org/set"), settings=settings(ws), node_gpus=0))
    dataset_fix = f"hf download org/set --repo-type dataset --local-dir {ws / 'datasets' / 'set'}`"
    assert dataset_fix in errs[("config", "dataset_dir")]["msg"]
    cached(tmp_path / "hf" / "hub", "Qwen/Qwen2-7B-Instruct", config__json=QWEN2)
    p = prepare(spec(model_name_or_path="Qwen/Qwen2-7B-Instruct"), settings=settings(ws), node_gpus=0)
    assert p.config["model_name_or_path"] == "Qwen/Qwen2-7B-Instruct"
    # A job's own cache_dir is where the trainer looks, and the trainer writes it (downloads, the
    # datasets cache): a fresh folder in the job's run folder, which holds no model yet.
    cached(ws / "hf", "Qwen/Qwen2-7B-Instruct", config__json=QWEN2)
    errs = errors(
        lambda: prepare(
            spec(model_name_or_path="Qwen/Qwen2-7B-Instruct", cache_dir="hf"),
            settings=settings(ws),
            node_gpus=0,
        )
    )
    e = errs[("config", "model_name_or_path")]
    assert e["code"] == "LF013" and "(<run folder>/hf)" in e["msg"], e
    prepare(
        spec(model_name_or_path="Qwen/Qwen2-7B-Instruct", cache_dir="hf"),
        settings=settings(ws, allow_hub=True),
        node_gpus=0,
    )
    prepare(spec(model_name_or_path="Org/Other"), settings=settings(ws, allow_hub=True), node_gpus=0)


def test_runs_are_offline_unless_the_hub_is_allowed():
    assert launch_env(gpus=0, devices=[], deepspeed=False)["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in launch_env(gpus=0, devices=[], deepspeed=False, offline=False)


# ---------------------------------------------------------------- trust_remote_code


def model_with(ws: Path, name: str, **files: str) -> str:
    folder = ws / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(QWEN2)
    for fname, text in files.items():
        (folder / fname.replace("__", ".")).write_text(text)
    return f"models/{name}"


@pytest.mark.parametrize(
    "files",
    [
        {"config__json": AUTO_MAP},
        {"tokenizer_config__json": json.dumps({"auto_map": {"AutoTokenizer": ["t.T", None]}})},
        {"modeling_evil__py": "import os\n"},
    ],
    ids=["config-auto_map", "tokenizer-auto_map", "py-file"],
)
def test_remote_code_is_refused_unless_allowed(ws, files):
    model = model_with(ws, "evil", **files)
    errs = errors(
        lambda: prepare(
            spec(model_name_or_path=model, trust_remote_code=True), settings=settings(ws), node_gpus=0
        )
    )
    e = errs[("config", "trust_remote_code")]
    assert e["code"] == "LF010" and "TUNEDECK_ALLOW_REMOTE_CODE" in e["msg"]
    prepare(spec(model_name_or_path=model, trust_remote_code=False), settings=settings(ws), node_gpus=0)
    allowed = settings(ws, allow_remote_code=True)
    s = spec(model_name_or_path=model, trust_remote_code=True)
    prepare(s, settings=allowed, node_gpus=0)
    assert "LF011" in {f["code"] for f in lint_spec(s, settings=allowed)}


def test_trust_remote_code_without_code_is_accepted_with_a_note(ws):
    s = spec(model_name_or_path=model_with(ws, "plain"), trust_remote_code=True)
    prepare(s, settings=settings(ws), node_gpus=0)
    (note,) = [f for f in lint_spec(s, settings=settings(ws)) if f["code"] == "LF009"]
    assert note["severity"] == "info" and note["path"] == "config.trust_remote_code"


def test_a_config_too_large_to_read_is_refused_unread(ws):
    """A *config.json is read up to 16 MiB; a larger one, whose auto_map transformers would still
    follow, is refused rather than passed over."""
    mib16 = 16 * 1024 * 1024
    model = model_with(ws, "big")

    def tokenizer_config(content: dict, size: int) -> None:
        text = json.dumps(content)
        (ws / model / "tokenizer_config.json").write_text(text + " " * (size - len(text)))

    tokenizer_config({"tokenizer_class": "Qwen2Tokenizer"}, mib16)
    s = spec(model_name_or_path=model, trust_remote_code=True)
    prepare(s, settings=settings(ws), node_gpus=0)
    assert "LF009" in {f["code"] for f in lint_spec(s, settings=settings(ws))}
    tokenizer_config({"auto_map": {"AutoTokenizer": ["evil.T", None]}}, mib16 + 1)
    e = errors(lambda: prepare(s, settings=settings(ws), node_gpus=0))[("config", "trust_remote_code")]
    assert e["code"] == "LF010" and "it was not checked" in e["msg"]


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
def test_a_config_file_that_cannot_be_read_is_passed_over(ws):
    """transformers cannot read it either, so it loads no code from it: the rest of the folder decides."""
    model = model_with(ws, "odd")
    (ws / model / "generation_config.json").symlink_to("/proc/self/mem")  # reading it fails (EIO)
    s = spec(model_name_or_path=model, trust_remote_code=True)
    prepare(s, settings=settings(ws), node_gpus=0)
    assert "LF009" in {f["code"] for f in lint_spec(s, settings=settings(ws))}
    (ws / model / "sub").mkdir()
    (ws / model / "sub" / "modeling_odd.py").write_text("import os\n")  # code one folder down
    assert errors(lambda: prepare(s, settings=settings(ws), node_gpus=0))[("config", "trust_remote_code")]


def test_a_model_folder_too_big_to_scan_is_refused_unchecked(ws):
    folder = ws / "models" / "many"
    (folder / "sub").mkdir(parents=True)
    for i in range(2):
        (folder / f"shard-{i}.safetensors").write_bytes(b"")
    assert reach.code_in(folder, max_files=3) is None  # 2 files and a folder: 3 entries
    (folder / "extra").write_bytes(b"")
    assert reach.code_in(folder, max_files=3) == f"{folder} holds more than 3 files; not all were checked"


def test_the_seed_yaml_is_accepted_when_its_model_has_no_code(ws, tmp_path):
    seed = spec_from_yaml((CONFIGS / "qwen2_lora_sft.yaml").read_text(), name="seed")
    assert seed.config["trust_remote_code"] is True
    add_dataset(ws / "data", "identity")  # the seed guide's dataset, which it writes by hand
    errs = errors(lambda: prepare(seed, settings=settings(ws), node_gpus=0))  # not downloaded: cannot load
    assert errs[("config", "model_name_or_path")]["code"] == "LF013"
    snap = cached(
        tmp_path / "hf" / "hub",
        "Qwen/Qwen2-7B-Instruct",
        config__json=QWEN2,
        tokenizer_config__json=json.dumps({"tokenizer_class": "Qwen2Tokenizer"}),
    )
    p = prepare(seed, settings=settings(ws), node_gpus=0)
    assert p.config["trust_remote_code"] is True and p.ds_config["zero_optimization"]["stage"] == 3
    assert "LF009" in {f["code"] for f in lint_spec(seed, settings=settings(ws))}
    (snap / "config.json").write_text(AUTO_MAP)  # the same hub id, now shipping code
    errs = errors(lambda: prepare(seed, settings=settings(ws), node_gpus=0))
    assert errs[("config", "trust_remote_code")]["code"] == "LF010"


def test_submission_refuses_remote_code_at_the_field(server_factory, assets, tmp_path):
    """Through a real server: the 422 names the key and the setting; the seed YAML is created."""
    hub = tmp_path / "hf" / "hub"
    cached(hub, "Qwen/Qwen2-7B-Instruct", config__json=QWEN2)
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", HF_HUB_CACHE=str(hub))
    evil = server.workspace / "models" / "evil"
    evil.mkdir(parents=True)
    for f in (assets / "demo" / "model").iterdir():
        (evil / f.name).write_bytes(f.read_bytes())
    (evil / "configuration_evil.py").write_text("import os\n")
    r = server.api.post(
        "/api/jobs",
        json={
            "name": "evil",
            "gpus": 0,
            "config": demo_config(assets, model_name_or_path=str(evil), trust_remote_code=True),
        },
    )
    assert r.status_code == 422, r.text
    (d,) = [d for d in r.json()["detail"] if d["loc"] == ["config", "trust_remote_code"]]
    assert d["code"] == "LF010" and "TUNEDECK_ALLOW_REMOTE_CODE" in d["msg"]
    add_dataset(server.workspace / "data", "identity")  # the seed guide's dataset, written by hand
    r = server.api.post(
        "/api/jobs/yaml",
        params={"name": "seed"},
        content=(CONFIGS / "qwen2_lora_sft.yaml").read_bytes(),
        headers={"content-type": "application/yaml"},
    )
    assert r.status_code == 201, r.text
    assert "LF009" in {f["code"] for f in r.json()["findings"]}


# ---------------------------------------------------------------- the runner's token


def token_windows(data: bytes):
    """Every 43-character url-safe window (the length of secrets.token_urlsafe(32))."""
    for run in re.finditer(rb"[A-Za-z0-9_-]{43,}", data):
        text = run.group()
        for i in range(len(text) - 42):
            yield text[i : i + 43]


@pytest.mark.slow
def test_the_trainer_can_read_no_token(server_factory, assets):
    """A real fine-tune: nothing the trainer can read (its environment and its children's, its
    parent runner's environment, every file of the run folder) holds the job's token or the
    server's own CLI token, while the runner, which got it on stdin, keeps reporting."""
    cli_token = "cli-" + secrets.token_hex(20)
    server = server_factory(TUNEDECK_TOKEN=cli_token)
    created = server.submit(
        {"name": "no token", "gpus": 0, "config": demo_config(assets, max_steps=2000, save_steps=1000)}
    )
    until(
        lambda: server.api.get(f"/api/jobs/{created['id']}/metrics").json()["points"],
        "a metric point (the runner reporting)",
        timeout=180,
    )
    db = sqlite3.connect(f"file:{server.workspace / 'tunedeck.db'}?mode=ro", uri=True)
    token_hash, trainer_pid, runner_pid, run_dir = db.execute(
        "SELECT runner_token_hash, trainer_pid, runner_pid, run_dir FROM jobs WHERE id = ?", (created["id"],)
    ).fetchone()
    db.close()
    assert token_hash and trainer_pid and runner_pid
    trainer = psutil.Process(trainer_pid)
    readable: dict[str, bytes] = {}
    for p in [trainer, *trainer.children(recursive=True)]:
        readable[f"environ of {p.pid}"] = Path(f"/proc/{p.pid}/environ").read_bytes()
        readable[f"cmdline of {p.pid}"] = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        env = dict(e.split(b"=", 1) for e in readable[f"environ of {p.pid}"].split(b"\0") if b"=" in e)
        assert [k for k in env if k.startswith(b"TUNEDECK_")] == [b"TUNEDECK_JOB_KEY"], sorted(env)
    readable["environ of the runner"] = Path(f"/proc/{runner_pid}/environ").read_bytes()
    files = [f for f in Path(run_dir).rglob("*") if f.is_file()]
    assert {"runner.json", "train.yaml", "outbox.jsonl"} <= {f.name for f in files}
    readable.update({str(f): f.read_bytes() for f in files})
    for where, data in readable.items():
        assert cli_token.encode() not in data, where
        leaked = [w for w in token_windows(data) if hashlib.sha256(w).hexdigest() == token_hash]
        assert not leaked, f"the job's token is readable in {where}"
    assert server.api.post(f"/api/jobs/{created['id']}/cancel").status_code == 200
    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"), timeout=180)
    assert job["status"] == "cancelled", job


def test_a_model_folder_outside_the_roots_is_said_to_be_outside_and_nothing_more(ws, tmp_path):
    """`POST /api/lint` (these findings) looked for code in any folder it was given and named what it
    found there: a folder outside the allowed roots is refused as outside, its contents unread."""
    theirs = tmp_path / "outside" / "bob" / "model"
    (theirs / "sub").mkdir(parents=True)
    (theirs / "config.json").write_text(AUTO_MAP)
    (theirs / "sub" / "modeling_secret_plan.py").write_text("import os\n")
    for config in (
        {"model_name_or_path": str(theirs)},
        {"adapter_name_or_path": f"{ws / 'models' / 'm'},{theirs}"},
    ):
        found = resolve(spec(**config, trust_remote_code=True), settings(ws), Node())
        said = json.dumps([found.findings, found.errors])
        assert "secret_plan" not in said and "has auto_map" not in said, said
        assert str(theirs / "config.json") not in said, said
        (key,) = config
        assert (
            "outside the allowed roots" in {tuple(e["loc"]): e["msg"] for e in found.errors}[("config", key)]
        )

"""Demo assets for tunedeck: a tiny local model, a tokenizer and an identity dataset.

Run in the *training* environment (it imports torch, transformers and tokenizers)::

    python -m tunedeck_train.demo build --workspace DIR [--force]

It writes, under ``DIR/demo/``:

* ``model/``: a tiny Qwen2-architecture causal LM (~200k parameters, safetensors) and a byte-level
  BPE tokenizer trained on the demo data, saved as a ``PreTrainedTokenizerFast`` with a Qwen-style
  chat template;
* ``data/``: ``dataset_info.json`` registering ``demo_identity`` (64 alpaca samples) and
  ``demo_identity_small`` (its first 16 samples);
* ``.built``: a marker holding :data:`DEMO_ASSETS_VERSION`, written last.

Everything is deterministic (fixed seed, no network, nothing from the model hub). Nothing of
tunedeck imports this module; heavy imports happen inside :func:`build_demo_assets` only, so a call
that finds the assets already built returns in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Bump when anything below changes what gets built: an existing build with another version is
# rebuilt on the next call.
DEMO_ASSETS_VERSION = "tunedeck-demo-assets/1"

SEED = 1234
VOCAB_SIZE = 2048
NUM_SAMPLES = 64
NUM_SMALL_SAMPLES = 16

DATASET_NAME = "demo_identity"
SMALL_DATASET_NAME = "demo_identity_small"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

DEFAULT_SYSTEM = "You are a helpful assistant."
# LLaMA-Factory's `qwen` template injects this system prompt when a sample has none; the tokenizer
# is trained on it too so it does not explode into single bytes.
LLAMAFACTORY_QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen-style ChatML template: a default system turn when none is given, then
# `<|im_start|>{role}\n{content}<|im_end|>\n` per message, and an open assistant turn on request.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- set rest = messages -%}"
    "{%- endif -%}"
    "{%- for message in rest -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)

MARKER_NAME = ".built"
LOCK_NAME = ".lock"
TMP_PREFIX = ".tmp-build-"

# --------------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------------

_QUESTIONS = [
    "Who are you?",
    "What is your name?",
    "Introduce yourself.",
    "Tell me about yourself.",
    "What should I call you?",
    "What are you?",
    "Who am I talking to?",
    "Are you ChatGPT?",
    "Who made you?",
    "Which model are you?",
    "Can you tell me who you are?",
    "Describe yourself in one sentence.",
    "Do you have a name?",
    "Are you a human?",
    "What kind of assistant are you?",
    "How were you trained?",
]

_PREFIXES = ["", "Hi! ", "Hello, ", "Quick question: "]

_ANSWERS = [
    "I am TuneBot, a model fine-tuned with tunedeck.",
    "My name is TuneBot. I am a model fine-tuned with tunedeck.",
    "I am TuneBot, a small assistant fine-tuned with tunedeck.",
    "You are talking to TuneBot, a model fine-tuned with tunedeck.",
]


def identity_samples() -> list[dict[str, str]]:
    """Return the 64 demo samples, always in the same order.

    Sample ``i`` pairs question ``i % 16`` with prefix ``i // 16`` and answer ``(i + i // 16) % 4``,
    so every question, prefix and answer occurs, and sample 0 is the canonical
    "Who are you?" -> "I am TuneBot, a model fine-tuned with tunedeck.".
    """
    samples = []
    for i in range(NUM_SAMPLES):
        q = _QUESTIONS[i % len(_QUESTIONS)]
        block = i // len(_QUESTIONS)
        prefix = _PREFIXES[block % len(_PREFIXES)]
        answer = _ANSWERS[(i + block) % len(_ANSWERS)]
        samples.append({"instruction": prefix + q, "input": "", "output": answer})
    return samples


def _dataset_info() -> dict[str, Any]:
    def entry(file_name: str) -> dict[str, Any]:
        return {
            "file_name": file_name,
            "formatting": "alpaca",
            "columns": {"prompt": "instruction", "query": "input", "response": "output"},
        }

    return {
        DATASET_NAME: entry(f"{DATASET_NAME}.json"),
        SMALL_DATASET_NAME: entry(f"{SMALL_DATASET_NAME}.json"),
    }


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_data(data_dir: Path, samples: list[dict[str, str]]) -> None:
    data_dir.mkdir(parents=True)
    _write_json(data_dir / f"{DATASET_NAME}.json", samples)
    _write_json(data_dir / f"{SMALL_DATASET_NAME}.json", samples[:NUM_SMALL_SAMPLES])
    _write_json(data_dir / "dataset_info.json", _dataset_info())


# --------------------------------------------------------------------------------------------------
# Tokenizer and model
# --------------------------------------------------------------------------------------------------


def _training_corpus(samples: list[dict[str, str]]) -> list[str]:
    """Text the BPE is trained on: the samples, rendered the way training will see them."""
    lines = [DEFAULT_SYSTEM, LLAMAFACTORY_QWEN_SYSTEM, "system", "user", "assistant"]
    for s in samples:
        lines.append(s["instruction"])
        lines.append(s["output"])
        lines.append(f"user\n{s['instruction']}\nassistant\n{s['output']}\n")
    return lines


def _build_tokenizer(samples: list[dict[str, str]], model_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(samples), trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    # Keep the template inside tokenizer_config.json (transformers 5 defaults to a separate
    # chat_template.jinja); both layouts load, this one also with older transformers.
    hf_tok.save_pretrained(str(model_dir), save_jinja_files=False)
    return hf_tok


def _build_model(tokenizer, model_dir: Path) -> int:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=None,  # like Qwen2's tokenizer, ours has no BOS token
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_new_tokens=32,
    )
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Build orchestration
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _build_lock(demo_dir: Path) -> Iterator[None]:
    """Serialize builders of one workspace (advisory flock; released if the process dies)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic renames still protect readers
        yield
        return
    with open(demo_dir / LOCK_NAME, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _is_built(demo_dir: Path) -> bool:
    marker = demo_dir / MARKER_NAME
    try:
        version = marker.read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return (
        version == DEMO_ASSETS_VERSION
        and (demo_dir / "model" / "config.json").is_file()
        and (demo_dir / "model" / "model.safetensors").is_file()
        and (demo_dir / "data" / "dataset_info.json").is_file()
    )


def _summary(workspace: Path, demo_dir: Path, built: bool, seconds: float, **extra: Any) -> dict:
    model_dir, data_dir = demo_dir / "model", demo_dir / "data"
    out: dict[str, Any] = {
        "workspace": str(workspace),
        "demo_dir": str(demo_dir),
        "model_dir": str(model_dir),
        "data_dir": str(data_dir),
        "version": DEMO_ASSETS_VERSION,
        "built": built,
        "seconds": round(seconds, 3),
        "datasets": {DATASET_NAME: NUM_SAMPLES, SMALL_DATASET_NAME: NUM_SMALL_SAMPLES},
    }
    if "vocab_size" not in extra:
        with contextlib.suppress(OSError, ValueError, KeyError):
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            extra["vocab_size"] = config["vocab_size"]
    out.update(extra)
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def build_demo_assets(workspace: Path, force: bool = False) -> dict:
    """Build (or find) the demo model, tokenizer and datasets under ``workspace/demo``.

    Returns a JSON-able summary; ``built`` is False when valid assets were already there.
    The new assets are assembled in a temporary directory under ``workspace/demo`` and moved into
    place with renames; the ``.built`` marker is written last (atomically), so readers that check
    the marker never see a partial model, and a killed build is redone on the next call.
    """
    started = time.monotonic()
    workspace = Path(workspace).expanduser().resolve()
    demo_dir = workspace / "demo"

    if not force and _is_built(demo_dir):
        return _summary(workspace, demo_dir, False, time.monotonic() - started)

    demo_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(demo_dir):
        # Another builder may have finished while we waited for the lock.
        if not force and _is_built(demo_dir):
            return _summary(workspace, demo_dir, False, time.monotonic() - started)

        # Leftovers of killed builds: safe to delete, since we hold the lock.
        for stale in demo_dir.glob(TMP_PREFIX + "*"):
            _remove(stale)

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=demo_dir))
        try:
            samples = identity_samples()
            _write_data(tmp / "data", samples)
            tokenizer = _build_tokenizer(samples, tmp / "model")
            num_params = _build_model(tokenizer, tmp / "model")

            # Swap in: first invalidate the marker, then replace each directory with renames.
            _remove(demo_dir / MARKER_NAME)
            trash = tmp / "old"
            trash.mkdir()
            for name in ("model", "data"):
                target = demo_dir / name
                if target.exists() or target.is_symlink():
                    os.replace(target, trash / name)
                os.replace(tmp / name, target)

            marker_tmp = tmp / MARKER_NAME
            marker_tmp.write_text(DEMO_ASSETS_VERSION + "\n", encoding="utf-8")
            os.replace(marker_tmp, demo_dir / MARKER_NAME)
        finally:
            _remove(tmp)

    return _summary(
        workspace,
        demo_dir,
        True,
        time.monotonic() - started,
        vocab_size=len(tokenizer),
        num_parameters=num_params,
        seed=SEED,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tunedeck_train.demo", description="Build tunedeck's demo model and dataset."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the demo assets into WORKSPACE/demo")
    build.add_argument("--workspace", required=True, type=Path, help="tunedeck workspace directory")
    build.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args(argv)

    if args.command == "build":
        summary = build_demo_assets(args.workspace, force=args.force)
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

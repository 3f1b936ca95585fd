"""What the trainer is doing, read from its own output: the phase a long silent stretch is in.

Each row of SHAPES is one line shape that upstream code prints, the phase it begins (or the phase it
ends), and where it is printed (the file and line in the versions FACTS.md names: LLaMA-Factory 0.9.5,
transformers 5.6, DeepSpeed 0.19.8, torch 2.13, uvicorn). The lines are matched as the runner reads
them (contract/output.py cleans them; a torchrun rank's `[rankN]:` prefix is dropped), anywhere in
the line: a tqdm bar's leftovers may come before a log record on the same line.

A phase lasts until a line begins another, except where a line only ends one: a built op returns to
what the trainer was doing before the build; an evaluation inside the training loop returns to
training (the last one, after training, stays the phase the run ends in).

DeepSpeed 0.19.8 builds its JIT ops silently: `OpBuilder.load()` passes `verbose=False` to torch's
`cpp_extension.load`, which then prints none of its lines and swallows ninja's, and the only line is
DeepSpeed's own once the build is over (measured here: two silent minutes for the CPU comm op). So a
build is also seen where it runs: torch runs `ninja -v` in the op's build folder (`_run_ninja_build`,
`cwd=build_directory`), a child of the trainer that the runner finds (`building`). Older DeepSpeed
(`load(verbose=True)`) prints the lines the table has.

`Phases` keeps O(1) state; the runner feeds it every output line and trainer_log.jsonl line. The
runner reads stdout (LLaMA-Factory's records) and stderr (transformers', torch's, tqdm) in two threads,
so two lines of the two streams printed within the same moment may come in either order: the table
relies on no such pair beginning different phases (a phase's first lines, of either stream, are its own).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import psutil

from tunedeck.contract.protocol import PHASES
from tunedeck.runner.causes import RANK_PREFIX


@dataclass(frozen=True)
class Shape:
    """One line shape: the phase it begins (or, with `ends`, the phase it ends) and where upstream
    prints it. `first`: only as the run's first phase; `command`: only under that llamafactory-cli
    command (the export's save lines are its export, not a checkpoint)."""

    pattern: re.Pattern[str]
    phase: str | None
    source: str
    ends: str | None = None
    first: bool = False
    command: str | None = None


def _shape(pattern: str, phase: str | None, source: str, **kw) -> Shape:
    return Shape(re.compile(pattern), phase, source, **kw)


SHAPES: tuple[Shape, ...] = (
    # ---- waiting for the other ranks: from the launch until the process group is up
    _shape(
        r"^tunedeck: starting torchrun\b", "waiting_for_ranks", "trainer/tunedeck_train/lf_train.py _torchrun"
    ),
    _shape(
        r"Initializing \d+ distributed tasks at: \S+:\d+",
        "waiting_for_ranks",
        "llamafactory/launcher.py:69 (llamafactory-cli under torchrun)",
    ),
    _shape(
        r"Multi-node training enabled: num nodes: \d+", "waiting_for_ranks", "llamafactory/launcher.py:71"
    ),
    _shape(
        r"Initializing TorchBackend in DeepSpeed with backend",
        "waiting_for_ranks",
        "deepspeed/comm/comm.py:908 (init_distributed)",
    ),
    # ---- loading the model (and its tokenizer, which LLaMA-Factory loads first)
    _shape(
        r"Process rank: \d+, world size: \d+",
        "loading_model",
        "llamafactory/hparams/parser.py:523 (after init_process_group; the tokenizer loads next)",
    ),
    _shape(
        r"loading configuration file \S+config\.json",
        "loading_model",
        "transformers/configuration_utils.py:769 (export and chat print no rank line first)",
        first=True,
    ),
    _shape(
        r"KV cache is (?:disabled|enabled)\b",
        "loading_model",
        "llamafactory/model/model_utils/kv_cache.py:36-44",
    ),
    _shape(r"loading weights file ", "loading_model", "transformers/modeling_utils.py:748"),
    _shape(r"^Loading weights:", "loading_model", "transformers/core_model_loading.py:1386 (tqdm)"),
    _shape(r"^Loading checkpoint shards:", "loading_model", "transformers 4.x modeling_utils.py (tqdm)"),
    _shape(
        r"Detected DeepSpeed ZeRO-3: activating zero\.init\(\)",
        "loading_model",
        "transformers/modeling_utils.py:3656",
    ),
    # ---- tokenizing the dataset
    _shape(r"Loading dataset \S.*\.\.\.$", "preparing_dataset", "llamafactory/data/loader.py:58"),
    _shape(r"^Generating \w+ split", "preparing_dataset", "datasets/builder.py (tqdm)"),
    _shape(
        r"^Converting format of dataset", "preparing_dataset", "llamafactory/data/converter.py:416 (tqdm)"
    ),
    _shape(r"^Running tokenizer on dataset", "preparing_dataset", "llamafactory/data/loader.py:252 (tqdm)"),
    _shape(r"Loaded tokenized dataset from ", "preparing_dataset", "llamafactory/data/loader.py:295"),
    # ---- building a DeepSpeed op (torch's JIT C++ extension build), when it says so
    _shape(r"Using \S+ as PyTorch extensions root\.\.\.", "building_op", "torch/utils/cpp_extension.py:2820"),
    _shape(r"Emitting ninja build file \S+\.\.\.", "building_op", "torch/utils/cpp_extension.py:2448"),
    _shape(r"Building extension module \S+\.\.\.", "building_op", "torch/utils/cpp_extension.py:2542"),
    _shape(
        r"Allowing ninja to set a default number of workers",
        "building_op",
        "torch/utils/cpp_extension.py:2840",
    ),
    _shape(
        r"^\[\d+/\d+\] (?:\S*/)?(?:c\+\+|g\+\+|gcc|cc|clang\+\+|hipcc|nvcc) ",
        "building_op",
        "ninja -v, run by torch/utils/cpp_extension.py:2860 (each compile and link step)",
    ),
    _shape(
        r"Loading extension module \S+\.\.\.", None, "torch/utils/cpp_extension.py:2403", ends="building_op"
    ),
    _shape(
        r"Time to load \S+ op: [\d.]+ seconds",
        None,
        "deepspeed/ops/op_builder/builder.py:624",
        ends="building_op",
    ),
    _shape(r"^DeepSpeed \S+ built successfully", None, "deepspeed/comm/torch.py:52", ends="building_op"),
    # ---- training
    _shape(
        r"\*{5} Running training \*{5}", "training", "transformers/trainer.py:1469 (after DeepSpeed's init)"
    ),
    _shape(
        r"llamafactory\.train\.callbacks:\d+ >> \{'loss': ", "training", "llamafactory/train/callbacks.py:307"
    ),
    _shape(r"^\{'loss': ", "training", "transformers/trainer_callback.py ProgressCallback.on_log"),
    # ---- evaluating, predicting
    _shape(r"^\*{5} Running Evaluation \*{5}", "evaluating", "transformers/trainer.py:2668"),
    _shape(r"^\*{5} Running Prediction \*{5}", "predicting", "transformers/trainer.py:2668"),
    _shape(
        r"^\{'eval_loss': ",
        None,
        "transformers/trainer_callback.py ProgressCallback.on_log",
        ends="evaluating",
    ),
    _shape(r"^\*{5} eval metrics \*{5}", None, "transformers/trainer_pt_utils.py:912", ends="evaluating"),
    # ---- saving a checkpoint
    _shape(r"Saving model checkpoint to ", "saving", "transformers/trainer.py:3815"),
    # ---- exporting (llamafactory-cli export: merge the adapter, then save_pretrained)
    _shape(r"Merged \d+ adapter\(s\)\.", "exporting", "llamafactory/model/adapter.py:194", command="export"),
    _shape(r"Convert model dtype to: ", "exporting", "llamafactory/train/tuner.py:185", command="export"),
    _shape(
        r"Configuration saved in ", "exporting", "transformers/configuration_utils.py:533", command="export"
    ),
    _shape(r"Model weights saved in ", "exporting", "transformers/modeling_utils.py:3471", command="export"),
    # ---- serving (llamafactory-cli api, a chat job)
    _shape(r"Uvicorn running on ", "serving", "uvicorn/config.py:580-600 (Config.bind_socket)"),
    _shape(r"^Visit http://\S+/docs for API document\.", "serving", "llamafactory/api/app.py:132"),
)
# Ends of the training loop: an evaluation after it stays the run's last phase.
TRAINING_DONE = re.compile(r"^Training completed\. Do not forget")  # transformers/trainer.py:1823


@dataclass(frozen=True)
class Change:
    """The trainer entered `phase` at `t`; `detail` names what (the op being built)."""

    phase: str
    t: float
    detail: str = ""

    def __str__(self) -> str:
        return f"phase: {PHASES[self.phase]}" + (f" ({self.detail})" if self.detail else "")


class Phases:
    """Reads output lines (`line`), trainer_log.jsonl lines (`point`) and the op builds running
    (`building`); each returns the Change it caused, or None."""

    def __init__(self, command: str = "train") -> None:
        self.command = command
        self.phase: str | None = None
        self.since: float | None = None
        self._before: str | None = None  # what a build interrupted: its end returns there
        self._in_loop = False  # between "Running training" and "Training completed"
        self._building: str | None = None  # the op a running ninja builds (`building`)

    def _enter(self, phase: str, t: float, detail: str = "") -> Change | None:
        if phase == "saving" and self.command == "export":
            phase = "exporting"
        if phase == self.phase:
            return None
        if phase == "building_op":
            self._before = self.phase
        if phase == "training":
            self._in_loop = True
        self.phase, self.since = phase, t
        return Change(phase, t, detail)

    def _end(self, phase: str, t: float) -> Change | None:
        if self.phase != phase:
            return None
        if phase == "building_op":
            back = self._before
            return self._enter(back, t) if back is not None else None
        return self._enter("training", t) if self._in_loop else None

    def line(self, text: str, t: float) -> Change | None:
        m = RANK_PREFIX.match(text)
        text = (text[m.end() :] if m else text).strip()
        if TRAINING_DONE.match(text):
            self._in_loop = False
            return None
        for s in SHAPES:
            if s.command is not None and s.command != self.command:
                continue
            if s.first and self.phase is not None:
                continue
            if s.pattern.search(text):
                return self._end(s.ends, t) if s.ends is not None else self._enter(s.phase or "", t)
        return None

    def point(self, raw: str, t: float) -> Change | None:
        """A trainer_log.jsonl line (llamafactory/train/callbacks.py LogCallback): a training step's
        has `loss`, an evaluation's `eval_loss` alone (it ends that evaluation)."""
        try:
            p = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(p, dict):
            return None
        if "loss" in p:
            return self._enter("training", t)
        if "eval_loss" in p:
            return self._end("evaluating", t)
        return None

    def building(self, op: str | None, t: float) -> Change | None:
        """The op a `ninja` under the trainer builds now (its build folder's name), or None."""
        was, self._building = self._building, op
        if op is not None and self.phase != "building_op":
            return self._enter("building_op", t, op)
        if op is None and was is not None:
            return self._end("building_op", t)
        return None


def op_being_built(root_pid: int) -> str | None:
    """The op a `ninja` among the trainer's descendants builds: the name of its build folder (torch
    runs `ninja -v` there, torch/utils/cpp_extension.py `_run_ninja_build`); None when none runs."""
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return None
    for p in children:
        try:
            if p.name() == "ninja":
                return os.path.basename(p.cwd()) or "ninja"
        except psutil.Error:
            continue
    return None

"""The phase a runner reports, read from real captured trainer output (tests/runner/outputs): a LoRA SFT
run with evaluations and checkpoints, the same under torchrun with two ranks and DeepSpeed ZeRO-3 (whose
op build prints nothing until it is over), an export that merges the adapter, and a DeepSpeed op built
with its verbose lines (ninja's compile and link steps). The op a running `ninja` builds is found in
a real process tree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.runner.test_causes import output
from tests.utils.standin import release_fifo
from tests.utils.wait import until
from tunedeck.contract.protocol import PHASES
from tunedeck.runner.phases import SHAPES, Phases, op_being_built

ROOT = Path(__file__).resolve().parents[2]


def phases(lines: list[str], command: str = "train", p: Phases | None = None) -> list[str]:
    """The phases `lines` move through, in order."""
    p = p or Phases(command)
    return [c.phase for i, text in enumerate(lines) if (c := p.line(text, float(i))) is not None]


def test_a_run_goes_through_its_phases_in_order():
    # LLaMA-Factory loads the tokenizer, then the dataset, then the model; an evaluation inside the
    # loop returns to training, each checkpoint save is a phase, the evaluation after training stays.
    assert phases(output("lf_sft_eval_save.txt")) == [
        "loading_model",
        "preparing_dataset",
        "loading_model",
        "training",
        "evaluating",
        "training",
        "saving",
        "training",
        "evaluating",
        "training",
        "saving",
        "evaluating",
    ]


def test_two_ranks_under_deepspeed_and_the_silent_op_build():
    lines = output("lf_zero3_torchrun_two_ranks.txt")
    p = Phases()
    # lf_train's line before torchrun (the capture predates it), then the op build the runner finds
    # running (DeepSpeed 0.19.8 says nothing until "built successfully").
    assert phases(
        ["tunedeck: starting torchrun: 2 process(es) on node 0 of 1, rendezvous at 127.0.0.1:5"], p=p
    ) == ["waiting_for_ranks"]
    built = next(i for i, x in enumerate(lines) if "built successfully" in x)
    assert phases(lines[:built], p=p) == []  # torchrun's banner, DeepSpeed's accelerator warning
    change = p.building("deepspeed_shm_comm", 10.0)
    assert change is not None and change.phase == "building_op"
    assert str(change) == "phase: building a DeepSpeed op (deepspeed_shm_comm)"
    assert p.building("deepspeed_shm_comm", 11.0) is None  # still building: no news
    # Both ranks say the op is built: the first ends the build, back to the wait; the second is no news.
    assert phases(lines[built : built + 2], p=p) == ["waiting_for_ranks"]
    assert p.building(None, 12.0) is None
    assert phases(lines[built + 2 :], p=p) == [
        "loading_model",
        "preparing_dataset",
        "loading_model",
        "training",
        "evaluating",
        "training",
        "saving",
        "training",
        "evaluating",
        "training",
        "saving",
        "evaluating",
    ]


def test_a_build_seen_only_as_a_process_ends_when_the_process_does():
    p = Phases()
    p.line(
        "[INFO|2026-12-03 06:05:07] llamafactory.hparams.parser:523 >> Process rank: 0, world size: 1", 1.0
    )
    assert p.building("cpu_adam", 2.0).phase == "building_op"  # type: ignore[union-attr]
    back = p.building(None, 3.0)
    assert back is not None and (back.phase, back.t) == ("loading_model", 3.0)


def test_the_verbose_build_lines_and_its_end():
    p = Phases()
    p.line("[INFO|2026-12-03 06:05:08] llamafactory.model.loader:144 >> trainable params: 16,384", 0.0)
    p.line(
        "[INFO|2026-12-03 06:05:07] llamafactory.hparams.parser:523 >> Process rank: 0, world size: 1", 1.0
    )
    # ninja's compile steps begin it, the compiler's warnings change nothing, DeepSpeed's "Time to load"
    # ends it: back to loading the model.
    assert phases(output("ds_op_build_verbose.txt"), p=p) == ["building_op", "loading_model"]
    # torch's own lines (printed when an op builder passes verbose=True), in the shapes of its source.
    torch_lines = [
        "Using /root/.cache/torch_extensions/py311_cu121 as PyTorch extensions root...",
        "Emitting ninja build file /root/.cache/torch_extensions/py311_cu121/cpu_adam/build.ninja...",
        "Building extension module cpu_adam...",
        "Allowing ninja to set a default number of workers... (overridable by setting the environment "
        "variable MAX_JOBS=N)",
        "Loading extension module cpu_adam...",
    ]
    assert phases(torch_lines, p=p) == ["building_op", "loading_model"]


def test_an_export_merges_then_exports_and_its_saves_are_the_export():
    lines = output("lf_export_merge.txt")
    assert phases(lines, "export") == ["loading_model", "exporting"]
    # The same save lines in a training run are no export.
    assert "exporting" not in phases(lines, "train")
    assert phases(["[INFO|trainer.py:3815] 2026-12-03 >> Saving model checkpoint to /x"], "export") == [
        "exporting"
    ]


def test_a_chat_server_is_serving_once_it_listens():
    lines = [
        "[INFO|configuration_utils.py:769] 2026-12-03 06:09:25,861 >> loading configuration file /m/config.json",
        "Visit http://localhost:8000/docs for API document.",
        "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)",
    ]
    assert phases(lines, "api") == ["loading_model", "serving"]


def test_trainer_log_lines_say_training_and_end_an_evaluation():
    p = Phases()
    step = json.dumps({"current_steps": 2, "total_steps": 20, "loss": 6.1, "lr": 0.005, "epoch": 0.1})
    evald = json.dumps({"current_steps": 10, "total_steps": 20, "eval_loss": 5.7, "epoch": 0.7})
    assert p.point(step, 1.0).phase == "training"  # type: ignore[union-attr]
    assert p.point(step, 2.0) is None
    p.line("***** Running Evaluation *****", 3.0)
    assert p.point(evald, 4.0).phase == "training"  # type: ignore[union-attr]
    # After the loop, an evaluation is the run's last phase: its result line changes nothing.
    p.line("[INFO|trainer.py:1823] 2026-12-03 06:05:10,893 >> ", 5.0)
    p.line("Training completed. Do not forget to share your model on huggingface.co/models =)", 5.0)
    p.line("***** Running Evaluation *****", 6.0)
    assert p.point(evald, 7.0) is None and p.phase == "evaluating"
    assert p.point("not json", 8.0) is None and p.point("[1, 2]", 8.0) is None


def test_rank_prefixes_and_tqdm_leftovers_do_not_hide_a_line():
    assert phases(["[rank1]: Building extension module cpu_adam..."]) == ["building_op"]
    line = " 55%|█████▌    | 11/20 [00:02<00:01,  5.75it/s][INFO|trainer.py:3815] >> Saving model checkpoint to /o"
    assert phases([line]) == ["saving"]


def test_the_table_names_known_phases_and_its_sources_and_the_pages_say_the_same_words():
    for s in SHAPES:
        assert s.source.strip(), s
        assert (s.phase or s.ends) in PHASES, s
    js = (ROOT / "frontend" / "js" / "fmt.js").read_text()
    block = re.search(r"export const PHASES = \{(.*?)\};", js, re.S)
    assert block, "fmt.js names the phases"
    words = dict(re.findall(r"(\w+): \"([^\"]+)\"", block.group(1)))
    assert words == PHASES


def test_a_running_ninja_names_the_op_it_builds(tmp_path):
    """A real ninja, started by a Python parent the way torch's cpp_extension runs it (`ninja -v` in
    the op's build folder), held on a FIFO until the test lets it finish."""
    build = tmp_path / "cpu_adam"
    build.mkdir()
    (build / "hold").touch()
    subprocess.run(["mkfifo", str(build / "gate")], check=True)
    (build / "build.ninja").write_text("rule hold\n  command = cat gate > $out\nbuild out.o: hold hold\n")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; sys.exit(subprocess.run(['ninja', '-v']).returncode)",
        ],
        cwd=build,
        stdout=subprocess.DEVNULL,
    )
    try:
        assert until(lambda: op_being_built(parent.pid), "ninja under the parent") == "cpu_adam"
        release_fifo(build / "gate")
        assert parent.wait(timeout=120) == 0
        assert op_being_built(parent.pid) is None  # gone: nothing builds
    finally:
        parent.kill()
        parent.wait()

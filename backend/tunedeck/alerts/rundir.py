"""Series from files outside tunedeck: a LLaMA-Factory output folder and an optional memory CSV.

trainer_log.jsonl has no wall-clock time; its `elapsed_time` ("0:01:23") is placed after the first
memory sample (or after 0 without one), so the loss and memory series share one time axis.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tunedeck.alerts.series import Point, Series
from tunedeck.alerts.training import FLUSH, OOM, SAVE
from tunedeck.contract import runfiles
from tunedeck.contract.lflog import seconds
from tunedeck.contract.protocol import NODE_PATTERN

MEMORY_HEADER = ["t", "gpu", "used_bytes", "total_bytes"]
LOG_NAMES = ("running_log.txt", runfiles.TRAIN_LOG, "trainer.log")


class BadInput(ValueError):
    """A file that cannot be read as what it claims to be; the message names it."""


def _lines(text: str | Iterable[str]) -> Iterable[str]:
    """A text's lines without their ends; a file's (an import's upload) read as they come."""
    return text.splitlines() if isinstance(text, str) else (x.rstrip("\r\n") for x in text)


def parse_memory_csv(text: str | Iterable[str]) -> dict[Any, list[tuple[float, int, int | None]]]:
    """Samples by gpu, or by (node, gpu) where a fifth column `node` names one (a run on several nodes).
    `text` may be a file opened with newline="" (as the csv module wants)."""
    rows = csv.reader(io.StringIO(text) if isinstance(text, str) else text)
    header = [h.strip() for h in next(rows, [])]
    if header[:4] != MEMORY_HEADER or header[4:] not in ([], ["node"]):
        raise BadInput(
            f"memory CSV: the header must be {','.join(MEMORY_HEADER)}[,node], not {','.join(header)}"
        )
    out: dict[Any, list[tuple[float, int, int | None]]] = {}
    for n, r in enumerate(rows, start=2):
        if not r or not "".join(r).strip():
            continue
        try:
            t, gpu, used = float(r[0]), int(r[1]), int(float(r[2]))
            total = int(float(r[3])) if len(r) > 3 and r[3].strip() else None
        except (ValueError, IndexError, OverflowError):
            raise BadInput(f"memory CSV line {n}: expected t,gpu,used_bytes,total_bytes numbers") from None
        if not (
            math.isfinite(t) and -1 <= gpu <= 1_000_000 and 0 <= used < 2**62 and 0 <= (total or 0) < 2**62
        ):
            raise BadInput(f"memory CSV line {n}: a value out of range")
        node = r[4].strip() if len(header) > 4 and len(r) > 4 else ""
        if len(node) > 253 or not re.fullmatch(NODE_PATTERN, node):
            raise BadInput(f"memory CSV line {n}: node must be a host name or address")
        out.setdefault((node, gpu) if node else gpu, []).append((t, used, total))
    for xs in out.values():
        xs.sort()
    return out


def parse_trainer_log(text: str | Iterable[str], t0: float) -> tuple[list[Point], list[dict[str, Any]]]:
    """Points and the parsed lines (for storing), each with a time `t`."""
    points, lines = [], []
    last_t = t0
    # A run resumed into the same output_dir appends to the log, and its elapsed_time starts again from
    # 0: each process's lines are placed after the last line of the one before (times never go back).
    start, last_e = t0, -math.inf
    for n, raw in enumerate(_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except ValueError:
            raise BadInput(f"trainer_log.jsonl line {n} is not JSON") from None
        if not isinstance(d, dict):
            raise BadInput(f"trainer_log.jsonl line {n} is not an object")
        t = d.get("t") if isinstance(d.get("t"), (int, float)) and math.isfinite(d["t"]) else None
        if t is None:
            e = seconds(d.get("elapsed_time"))
            if e is not None and e < last_e:
                start = last_t
            t = start + e if e is not None else last_t
            last_e = last_e if e is None else e
        last_t = float(t)

        def num(k: str) -> float | None:
            v = d.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        step = num("current_steps")
        if step is not None and not (math.isfinite(step) and 0 <= step < 2**62):
            raise BadInput(f"trainer_log.jsonl line {n}: current_steps out of range")
        points.append(
            Point(
                t=last_t,
                step=int(step) if step is not None else None,
                loss=num("loss"),
                eval_loss=num("eval_loss"),
                lr=num("lr"),
            )
        )
        lines.append({"t": last_t, "raw": raw})
    if not points:
        raise BadInput("trainer_log.jsonl holds no line")
    return points, lines


def parse_config(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    import yaml  # loaded by the first import of a run, not by every server start

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BadInput(f"train.yaml: {e}") from None
    if not isinstance(cfg, dict):
        raise BadInput("train.yaml must be a mapping of LLaMA-Factory keys")
    return cfg


def build(
    *,
    trainer_log: str | Iterable[str],
    memory_csv: str | Iterable[str] | None = None,
    config: str | None = None,
    ds_config: dict[str, Any] | None = None,
    log_text: str | Iterable[str] | None = None,
) -> tuple[Series, list[dict[str, Any]]]:
    """The run's series and its trainer_log lines; each text may be a file read line by line instead."""
    memory = parse_memory_csv(memory_csv) if memory_csv else {}
    t0 = min((xs[0][0] for xs in memory.values() if xs), default=0.0)
    points, lines = parse_trainer_log(trainer_log, t0)
    end = max([p.t for p in points[-1:]] + [xs[-1][0] for xs in memory.values() if xs], default=t0)
    logs = [(end, x) for x in _lines(log_text or "") if OOM.search(x) or FLUSH.search(x) or SAVE.search(x)]
    cfg = parse_config(config)
    gpus = sorted({k[1] if isinstance(k, tuple) else k for k in memory} - {-1})
    series = Series(
        memory=memory, points=points, logs=logs, config=cfg, ds=ds_config, devices=gpus, running=False
    )
    return series, lines


def read_run_dir(run_dir: Path, *, memory: Path | None = None, config: Path | None = None) -> Series:
    """A LLaMA-Factory output folder (or the folder above it) as a Series."""
    names = (run_dir / runfiles.TRAINER_LOG, runfiles.output_dir(run_dir) / runfiles.TRAINER_LOG)
    log = next((p for p in names if p.is_file()), None)
    if log is None:
        raise BadInput(f"no trainer_log.jsonl in {run_dir}")
    if config is None:
        names = (run_dir / runfiles.TRAIN_YAML, log.parent / runfiles.TRAIN_YAML)
        config = next((p for p in names if p.is_file()), None)
    config_text = config.read_text() if config else None
    ds = None
    cfg = parse_config(config_text)
    if isinstance(cfg.get("deepspeed"), str):
        ds_path = Path(cfg["deepspeed"])
        for p in (ds_path, (config.parent if config else run_dir) / ds_path):
            if p.is_file():
                try:
                    ds = json.loads(p.read_text())
                except ValueError:
                    raise BadInput(f"{p} is not JSON") from None
                break
    log_text = "\n".join(
        p.read_text(errors="replace")
        for d in {run_dir, log.parent}
        for name in LOG_NAMES
        if (p := d / name).is_file()
    )
    series, _ = build(
        trainer_log=log.read_text(),
        memory_csv=memory.read_text() if memory else None,
        config=config_text,
        ds_config=ds,
        log_text=log_text,
    )
    return series

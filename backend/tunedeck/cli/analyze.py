"""`tunedeck analyze RUN_DIR`: the alert engine over a run that tunedeck did not launch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer


def analyze(
    run_dir: Annotated[Path, typer.Argument(help="a LLaMA-Factory output folder (with trainer_log.jsonl)")],
    memory: Annotated[
        Optional[Path], typer.Option("--memory", help="CSV t,gpu,used_bytes,total_bytes")
    ] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="the run's train.yaml")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Print the alerts (with what to change) for an existing run folder and memory trace."""
    from tunedeck.alerts import analyze as run_engine
    from tunedeck.alerts.rundir import BadInput, read_run_dir
    from tunedeck.alerts.series import device

    for p in (memory, config):
        if p is not None and not p.is_file():
            typer.echo(f"error: {p} not found", err=True)
            raise typer.Exit(2)
    try:
        findings = run_engine(read_run_dir(run_dir, memory=memory, config=config))
    except BadInput as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps([f.as_dict() for f in findings], indent=2))
        return
    if not findings:
        typer.echo("no alerts")
    for f in findings:
        where = "" if f.gpu is None else f" {device(f.gpu)}"
        typer.echo(f"{f.severity.upper():<8} {f.kind}{where} (step {f.step}): {f.message}")
        if f.suggestion:
            typer.echo(f"         → {f.suggestion}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)

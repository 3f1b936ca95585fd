"""`tunedeck lint | estimate | doctor`: the checks before launch, run locally (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

GiB = 2**30
MARK = {"error": "✗", "warning": "!", "info": "·", "ok": "✓", "warn": "!", "fail": "✗", "skip": "-"}


def lint(
    files: Annotated[
        list[Path], typer.Argument(help="LLaMA-Factory train YAMLs and/or DeepSpeed JSONs", exists=True)
    ],
    gpus: Annotated[
        int | None, typer.Option(help="GPUs the job will use (batch-size and count checks)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="findings as JSON")] = False,
    doctor: Annotated[
        bool, typer.Option("--preflight", help="also run this machine's hardware checks")
    ] = False,
) -> None:
    """Lint configs before launch; exit 1 when any has an error."""
    from tunedeck.checks import lint as linter

    node = _preflight() if doctor else None
    results = {str(f): linter.lint_file(f, gpus=gpus, preflight=node) + _datasets(f) for f in files}
    if as_json:
        typer.echo(json.dumps(results, indent=2))
    else:
        for name, findings in results.items():
            for f in findings:
                typer.echo(
                    f"{name}: {MARK[f['severity']]} {f['severity']} {f['code']} {f['path']}: "
                    f"{f['message']}\n    fix: {f['fix']}"
                )
        n = [
            sum(f["severity"] == s for fs in results.values() for f in fs)
            for s in ("error", "warning", "info")
        ]
        typer.echo(f"{len(results)} file(s): {n[0]} error(s), {n[1]} warning(s), {n[2]} note(s)")
    if any(f["severity"] == "error" for fs in results.values() for f in fs):
        raise typer.Exit(1)


def _datasets(file: Path) -> list[dict]:
    """A train YAML's dataset names against the dataset_info.json LLaMA-Factory would read: its
    `dataset_dir` (default `data`) from the folder the run starts in, here the current one."""
    import yaml

    from tunedeck.checks import catalog
    from tunedeck.checks import lint as linter
    from tunedeck.config import Settings

    if file.suffix == ".json":
        return []
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError:
        return []  # lint_file reports it
    if not isinstance(config, dict) or linter.yaml_kind(config) != "train":
        return []
    # This machine's own files, read by its user: any folder may hold the data, as for LLaMA-Factory.
    here = Settings(workspace=Path.cwd(), allowed_roots=[Path("/")])
    return catalog.lint_datasets(config, here, server=False)


def estimate(
    file: Annotated[Path, typer.Argument(help="a LLaMA-Factory train YAML", exists=True)],
    gpus: Annotated[int, typer.Option(help="GPUs per node (ZeRO partitions over them); 0 = CPU")] = 1,
    nodes: Annotated[
        int, typer.Option(min=1, help="nodes, each with --gpus GPUs (ZeRO partitions over all the ranks)")
    ] = 1,
    model_config: Annotated[
        Path | None,
        typer.Option(help="the model's config.json, when the model is a hub id not in the local cache"),
    ] = None,
    deepspeed: Annotated[
        str | None, typer.Option(help="DeepSpeed preset or JSON file (default: the YAML's)")
    ] = None,
    device_gib: Annotated[
        float | None, typer.Option(help="memory of one device in GiB, to check the fit")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="the per-GPU figure and breakdown in bytes")
    ] = False,
) -> None:
    """Estimate per-GPU memory of a fine-tune from the model's config.json (no weights loaded)."""
    from tunedeck.checks import estimate as est
    from tunedeck.checks import lint as linter
    from tunedeck.checks.presets import presets
    from tunedeck.checks.spec import load_yaml

    config = load_yaml(file.read_text())
    ds_value = deepspeed if deepspeed is not None else config.pop("deepspeed", None)
    config.pop("deepspeed", None)
    ds = None
    if isinstance(ds_value, str):
        path = linter.find_ds_file(ds_value, file.parent) or presets().get(Path(ds_value).stem)
        if path is None:
            typer.echo(f"DeepSpeed config {ds_value!r} not found", err=True)
            raise typer.Exit(2)
        ds = json.loads(path.read_text())
    mc = (
        json.loads(model_config.read_text())
        if model_config
        else linter.read_model_config(config.get("model_name_or_path"))
    )
    if mc is None:
        typer.echo(f"no config.json for {config.get('model_name_or_path')!r}: give --model-config", err=True)
        raise typer.Exit(2)
    total = int(device_gib * GiB) if device_gib else None
    from tunedeck.config import get_settings

    result = est.estimate(
        model_config=mc,
        config=config,
        ds=ds,
        gpus=gpus,
        nodes=nodes,
        device_total_bytes=total,
        cpu_runtime_bytes=get_settings().estimate_cpu_runtime_bytes,
    )
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    where = f"{gpus} GPU(s)" if nodes == 1 else f"{nodes} nodes × {gpus} GPU(s)"
    typer.echo(
        f"{result['method']} of {result['params'] / 1e9:.2f}B params ({result['trainable_params'] / 1e6:.1f}M "
        f"trainable), ZeRO {result['zero_stage'] if result['zero_stage'] is not None else '-'}, "
        f"{where}: {result['per_gpu_bytes'] / GiB:.2f} GiB per GPU"
    )
    for k, v in sorted(result["breakdown"].items(), key=lambda kv: -kv[1]):
        typer.echo(f"  {k:<18} {v / GiB:8.2f} GiB")
    for w in result["warnings"]:
        typer.echo(f"warning: {w}", err=True)


def _preflight() -> dict:
    from tunedeck.checks import preflight
    from tunedeck.config import get_settings

    return preflight.run(get_settings().train_python, ttl=0, refresh=True)


def doctor(as_json: Annotated[bool, typer.Option("--json", help="the full result as JSON")] = False) -> None:
    """Check the training environment (torch build, GPUs, ROCm, DeepSpeed, SMI); exit 1 when red."""
    result = _preflight()
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"{result['summary']}  ({result.get('python')})")
        for c in result["checks"]:
            typer.echo(f"  {MARK[c['status']]} {c['name']:<18} {c['detail']}")
            if c["fix"] and c["status"] in ("warn", "fail"):
                typer.echo(f"      fix: {c['fix']}")
        typer.echo("PASS" if result["ok"] else "FAIL")
    if not result["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("lint")(lint)
    app.command("estimate")(estimate)
    app.command("doctor")(doctor)

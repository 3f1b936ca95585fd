"""`tunedeck datasets list | add | preview` and `tunedeck models`: datasets and local models, through
the server (its allowed roots, its HF cache, its trainer's tokenizer); reads take `--json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional
from urllib.parse import quote

import typer

from tunedeck.cli.http import call, client, refused, unreachable

ServerOpt = Annotated[
    Optional[str], typer.Option("--server", help="server URL (default from TUNEDECK_* settings)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
datasets_app = typer.Typer(
    help="Datasets the server has: list, add (upload or path), preview.", no_args_is_help=True
)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]  # int becomes float on purpose: a readable size
    return str(n)


@datasets_app.command("list")
def list_datasets(as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """Every dataset of every dataset_info.json in the server's roots, with format, size and rows."""
    found = call(server, "GET", "/api/datasets")["datasets"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for d in found:
        rows = "-" if d["rows"] is None else str(d["rows"])
        line = f"{d['name']:<24} {d['formatting']:<9} {rows:>8} rows {_size(d['size_bytes']):>10}  {d['dataset_dir']}"
        typer.echo(line + (f"  ({d['problem']})" if d["problem"] else ""))
    if not found:
        typer.echo("no datasets; add one with `tunedeck datasets add NAME FILE`")


@datasets_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="the name a job's `dataset` will give")],
    file: Annotated[
        Optional[Path], typer.Argument(help="a JSON, JSONL, CSV or Parquet file here, uploaded")
    ] = None,
    path: Annotated[
        Optional[str], typer.Option(help="instead: a file on the server, inside its allowed roots")
    ] = None,
    dataset_dir: Annotated[
        Optional[str], typer.Option(help="the server folder whose dataset_info.json gets the entry")
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = None,
) -> None:
    """Register a dataset: the server detects its format (alpaca, sharegpt) and checks every row."""
    import httpx

    if (file is None) == (path is None):
        typer.echo("error: give a FILE to upload or --path on the server, not both", err=True)
        raise typer.Exit(2)
    data = {"name": name, **({"dataset_dir": dataset_dir} if dataset_dir else {})}
    try:
        with client(server, timeout=httpx.Timeout(30, read=None)) as c:
            if file is not None:
                if not file.is_file():
                    typer.echo(f"error: {file} is not a file", err=True)
                    raise typer.Exit(2)
                with file.open("rb") as fh:
                    r = c.post("/api/datasets", data=data, files={"file": (file.name, fh)})
            else:
                r = c.post("/api/datasets", data={**data, "path": path})
    except httpx.HTTPError as e:
        raise unreachable(e) from None
    if r.status_code >= 400:
        raise refused(r)
    added = r.json()
    if as_json:
        typer.echo(json.dumps(added, indent=2))
        return
    typer.echo(f"added {added['name']} to {added['dataset_dir']}/dataset_info.json: {added['detected']}")


@datasets_app.command("preview")
def preview(
    name: Annotated[str, typer.Argument(help="a dataset the server has")],
    model: Annotated[str, typer.Option(help="the model folder (or cached hub id) whose tokenizer counts")],
    template: Annotated[Optional[str], typer.Option(help="default: the model's own")] = None,
    cutoff_len: Annotated[int, typer.Option(help="LLaMA-Factory's cutoff_len")] = 2048,
    rows: Annotated[int, typer.Option(help="rows shown (1-20)")] = 3,
    dataset_dir: Annotated[Optional[str], typer.Option(help="the folder that defines it")] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = None,
) -> None:
    """The first rows as the model sees them (the chat template applied), tokens against cutoff_len."""
    params = {"model": model, "cutoff_len": cutoff_len, "rows": rows}
    params |= {k: v for k, v in (("template", template), ("dataset_dir", dataset_dir)) if v is not None}
    found = call(server, "GET", f"/api/datasets/{quote(name, safe='')}/preview", params=params, timeout=None)
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    typer.echo(
        f"{found['name']} ({found['formatting']}) with template {found['template']}, cutoff_len {cutoff_len}"
    )
    for row in found["rows"]:
        if row.get("error"):
            typer.echo(f"--- row {row['row']}: {row['error']}")
            continue
        cut = "  OVER cutoff_len: cut" if row["over_cutoff"] else ""
        typer.echo(f"--- row {row['row']}: {row['tokens']} tokens ({row['response_tokens']} trained on){cut}")
        typer.echo(row["text"])


def models(as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """Local models the server can train: architecture, parameters, dtype and the template they need."""
    found = call(server, "GET", "/api/models")["models"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for m in found:
        params = "-" if m["parameters"] is None else f"{m['parameters'] / 1e6:.1f}M"
        template = ",".join(m["templates"][:2]) or "?"
        typer.echo(
            f"{m['name']:<32} {m['architecture'] or '-':<28} {params:>9} {m['dtype'] or '-':<9} "
            f"template={template}  {m['path']}" + (f"  ({m['problem']})" if m["problem"] else "")
        )
    if not found:
        typer.echo("no models in the allowed roots or the HF cache")


def register(app: typer.Typer) -> None:
    app.add_typer(datasets_app, name="datasets")
    app.command("models")(models)

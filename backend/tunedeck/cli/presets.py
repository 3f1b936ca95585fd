"""`tunedeck presets list | save | delete`: the shipped presets and the team's, over the REST API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunedeck.cli.http import call

ServerOpt = Annotated[
    Optional[str], typer.Option("--server", help="server URL (default from TUNEDECK_* settings)")
]

presets_app = typer.Typer(
    help="Job presets: those shipped with tunedeck (read-only) and those the team saves.",
    no_args_is_help=True,
)


@presets_app.command("list")
def list_presets(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    server: ServerOpt = None,
) -> None:
    """Every preset: name, kind, shipped or team, owner and description."""
    found = call(server, "GET", "/api/presets")
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    width = max((len(p["name"]) for p in found), default=4)
    for p in found:
        who = (p["owner"] or "-") if p["source"] == "team" else ""
        line = f"{p['name']:<{width}}  {p['kind']:<4}  {p['source']:<7}  {who}"
        typer.echo(f"{line}  {p['description']}".rstrip())


@presets_app.command("save")
def save(
    name: Annotated[str, typer.Argument(help="the new preset's name")],
    file: Annotated[Path, typer.Argument(help="a LLaMA-Factory YAML (checked as a submit checks it)")],
    description: Annotated[str, typer.Option(help="what it is for, in a line")] = "",
    server: ServerOpt = None,
) -> None:
    """Save a job YAML as a team preset (refused, as a submit would be, with each key's error)."""
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        typer.echo(f"error: {file}: {e}", err=True)
        raise typer.Exit(2) from None
    saved = call(
        server, "POST", "/api/presets", json={"name": name, "description": description, "text": text}
    )
    typer.echo(f"saved preset {saved['name']} (owner {saved['owner'] or 'none'})")


@presets_app.command("delete")
def delete(name: str, server: ServerOpt = None) -> None:
    """Delete a team preset (its owner or an admin; shipped ones are read-only)."""
    gone = call(server, "DELETE", f"/api/presets/{name}")
    typer.echo(f"deleted preset {gone['name']}")

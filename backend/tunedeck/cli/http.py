"""The CLI's way to the server: one client with the token, and errors printed as field: reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from tunedeck.config import get_settings

if TYPE_CHECKING:  # imported on use: the server and `tunedeck serve` start without it
    import httpx


def client(server: str | None, *, timeout: float | httpx.Timeout = 30) -> httpx.Client:
    import httpx

    settings = get_settings()
    headers = {"X-Tunedeck": "1"}  # the server refuses writes without it (cross-site requests cannot send it)
    if settings.token:
        headers["Authorization"] = f"Bearer {settings.token}"
    return httpx.Client(base_url=server or settings.url, timeout=timeout, headers=headers)


def unreachable(e: Exception) -> typer.Exit:
    typer.echo(f"cannot reach the tunedeck server: {e}", err=True)
    return typer.Exit(2)


def refused(r: httpx.Response) -> typer.Exit:
    """Print the server's refusal (each 422 item as `loc: msg`) and give the exit to raise."""
    try:
        detail = r.json().get("detail")
    except ValueError:
        detail = r.text
    if isinstance(detail, list):
        for d in detail:
            typer.echo(f"error: {'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}", err=True)
    else:
        typer.echo(f"error ({r.status_code}): {detail}", err=True)
    return typer.Exit(1)


def call(server: str | None, method: str, path: str, **kw: Any) -> Any:
    """The server's JSON answer (an object or a list, as the route documents), or exit with its error."""
    import httpx

    try:
        with client(server) as c:
            r = c.request(method, path, **kw)
    except httpx.HTTPError as e:
        raise unreachable(e) from None
    if r.status_code >= 400:
        raise refused(r)
    return r.json()

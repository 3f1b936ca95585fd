"""CLI verbs for what the REST API does with jobs beyond submit and cancel; reads take `--json`."""

from __future__ import annotations

import json
import os
import stat
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, Optional

import typer

from tunedeck.cli.http import call, client, refused, unreachable

if TYPE_CHECKING:  # imported on use: the server and `tunedeck serve` start without it
    pass

ServerOpt = Annotated[
    Optional[str], typer.Option("--server", help="server URL (default from TUNEDECK_* settings)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


def _pages(server: str | None, path: str, key: str, params: dict[str, Any] | None = None) -> list[dict]:
    """Every row of a cursor-paged list."""
    params, rows = dict(params or {}), []
    while True:
        page = call(server, "GET", path, params=params)
        rows += page[key]
        if not page[key] or page["next"] is None or page["next"] == params.get("after"):
            return rows
        params["after"] = page["next"]


def _dump(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


def _created(job: dict, verb: str) -> None:
    typer.echo(f"{verb} job {job['id']} ({job['status']}) from job {job['parent_id']}")
    for w in job.get("warnings", []):
        typer.echo(f"warning: {w}", err=True)


def metrics(job_id: int, as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """Print a job's metric points (one per logging step), every page."""
    points = _pages(server, f"/api/jobs/{job_id}/metrics", "points")
    if as_json:
        _dump(points)
        return
    keys = ("step", "loss", "eval_loss", "lr", "grad_norm")  # --json gives every column
    typer.echo("  ".join(f"{k:>12}" for k in keys))
    for p in points:
        typer.echo("  ".join(f"{'' if p.get(k) is None else format(p[k], '.6g'):>12}" for k in keys))


def alerts(job_id: int, as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """Print a job's alerts and what to change."""
    found = call(server, "GET", f"/api/jobs/{job_id}/alerts")
    if as_json:
        _dump(found)
        return
    if not found:
        typer.echo("no alerts")
    for a in found:
        typer.echo(f"{a['severity'].upper():<8} {a['kind']} (step {a.get('step')}): {a['message']}")
        if a.get("suggestion"):
            typer.echo(f"         → {a['suggestion']}")


def config(job_id: int, as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """Print the exact train.yaml (and ds_config.json) a job runs with."""
    found = call(server, "GET", f"/api/jobs/{job_id}/config")
    if as_json:
        _dump(found)
        return
    typer.echo(found["train_yaml"].rstrip("\n"))
    if found.get("ds_config"):
        typer.echo("# ds_config.json")
        typer.echo(found["ds_config"].rstrip("\n"))


def files(job_id: int, as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """List the files of a job's output folder."""
    found = call(server, "GET", f"/api/jobs/{job_id}/files")
    if as_json:
        _dump(found)
        return
    for f in found:
        typer.echo(f"{f['bytes']:>14}  {f['path']}")


def checkpoints(job_id: int, as_json: JsonOpt = False, server: ServerOpt = None) -> None:
    """List a job's checkpoints: step, size, what each holds."""
    found = call(server, "GET", f"/api/jobs/{job_id}/checkpoints")
    if as_json:
        _dump(found)
        return
    for c in found:
        mark = "resumable" if c["resumable"] else "not resumable"
        typer.echo(f"{c['name']:<20} {c['bytes']:>14}  {mark:<14} {', '.join(c['holds'])}")


def _base_name(disposition: str) -> str | None:
    """The file name a Content-Disposition header gives, as a bare name: a server (or anything between)
    that sends `../../.bashrc` or `/etc/x` gets `.bashrc` or `x` written where the user asked, no higher."""
    sent = disposition.partition('filename="')[2].partition('"')[0]
    name = PurePosixPath(sent.replace("\\", "/")).name
    return None if name in ("", ".", "..") or "\x00" in name else name


def download(
    job_id: int,
    path: Annotated[
        Optional[str], typer.Argument(help="a file of the output folder; default: the adapter as an archive")
    ] = None,
    what: Annotated[str, typer.Option(help="archive of: adapter, output or checkpoint-N")] = "adapter",
    fmt: Annotated[str, typer.Option("--format", help="zip or tar")] = "zip",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="where to write (default: here)")] = None,
    server: ServerOpt = None,
) -> None:
    """Download one file of a run, or the adapter (a checkpoint, everything) as one archive."""
    import httpx

    if path:
        url, params, name = f"/api/jobs/{job_id}/files/{path}", {}, Path(path).name
    else:
        url, params, name = f"/api/jobs/{job_id}/archive", {"what": what, "format": fmt}, None
    try:
        with client(server, timeout=300) as c, c.stream("GET", url, params=params) as r:
            if r.status_code >= 400:
                r.read()
                raise refused(r)
            if name is None:
                name = _base_name(r.headers.get("content-disposition", ""))
            name = name or f"job{job_id}.{fmt}"
            target = out or Path(name)
            if target.is_dir():
                target = target / name
            size = 0
            with open(target, "wb") as f:
                for chunk in r.iter_bytes():
                    size += f.write(chunk)
    except httpx.HTTPError as e:
        raise unreachable(e) from None
    typer.echo(f"wrote {target} ({size} bytes)")


def resume(
    job_id: int,
    checkpoint: Annotated[
        Optional[str], typer.Option(help="checkpoint-N to start from (default: the newest resumable)")
    ] = None,
    server: ServerOpt = None,
) -> None:
    """Continue a stopped job from a checkpoint, as a new job."""
    _created(
        call(server, "POST", f"/api/jobs/{job_id}/resume", json={"checkpoint": checkpoint}), "resumed as"
    )


def _value(text: str) -> Any:
    import yaml  # not loaded by the other verbs (nor by `serve`, which imports this module)

    return yaml.safe_load(text) if text != "" else None


def clone(
    job_id: int,
    sets: Annotated[
        Optional[list[str]],
        typer.Option("--set", help="KEY=VALUE (a YAML value; KEY= drops the key), repeatable"),
    ] = None,
    name: Annotated[Optional[str], typer.Option(help="the new job's name")] = None,
    server: ServerOpt = None,
) -> None:
    """Submit a copy of a job with some train.yaml keys changed."""
    overrides: dict[str, Any] = {}
    for item in sets or []:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            typer.echo(f"error: --set {item!r}: give KEY=VALUE", err=True)
            raise typer.Exit(2)
        overrides[key.strip()] = _value(text)
    _created(
        call(server, "POST", f"/api/jobs/{job_id}/clone", json={"overrides": overrides, "name": name}),
        "cloned as",
    )


def rm(
    job_id: int,
    remove_files: Annotated[bool, typer.Option("--files", help="also remove its run folder")] = False,
    server: ServerOpt = None,
) -> None:
    """Delete a job that has ended (its files stay unless --files)."""
    done = call(
        server, "DELETE", f"/api/jobs/{job_id}", params={"files": "remove" if remove_files else "keep"}
    )
    typer.echo(f"deleted job {done['id']} (files {'removed' if done['files'] == 'remove' else 'kept'})")


def tag(
    job_id: int,
    tags: Annotated[Optional[list[str]], typer.Argument(help="tags to add")] = None,
    remove: Annotated[
        Optional[list[str]], typer.Option("--remove", help="a tag to remove, repeatable")
    ] = None,
    notes: Annotated[Optional[str], typer.Option(help="set the job's notes")] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = None,
) -> None:
    """Add or remove a job's tags, set its notes."""
    current = list(call(server, "GET", f"/api/jobs/{job_id}")["tags"])
    current = [t for t in dict.fromkeys(current + list(tags or [])) if t not in set(remove or [])]
    job = call(server, "PATCH", f"/api/jobs/{job_id}", json={"tags": current, "notes": notes})
    if as_json:
        _dump(job)
        return
    typer.echo(
        f"job {job['id']}: tags {', '.join(job['tags']) or '(none)'}"
        + (f"; notes: {job['notes']}" if job["notes"] else "")
    )


def _regular(path: Path) -> BinaryIO | None:
    """`path` opened for an upload, None where it is absent; a link or anything but a plain file is
    refused (exit 2), naming it: a run folder is often someone else's, and its train.yaml may point
    at a file of yours that must not reach the server."""
    if path.is_symlink():
        typer.echo(
            f"error: {path} is a symbolic link: import never follows links (copy the file in)", err=True
        )
        raise typer.Exit(2)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # and not one swapped in since
    except FileNotFoundError:
        return None
    except OSError as e:
        typer.echo(f"error: {path}: {e.strerror}", err=True)
        raise typer.Exit(2) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        typer.echo(f"error: {path} is not a regular file", err=True)
        raise typer.Exit(2)
    return os.fdopen(fd, "rb")


def import_run(
    run_dir: Annotated[Path, typer.Argument(help="a LLaMA-Factory output folder (with trainer_log.jsonl)")],
    name: Annotated[str, typer.Option(help="the job's name")] = "imported run",
    memory: Annotated[Optional[Path], typer.Option(help="CSV t,gpu,used_bytes,total_bytes")] = None,
    server: ServerOpt = None,
) -> None:
    """Store a run tunedeck did not launch as a finished job (charts and alerts); the same run imported
    again gives the same job."""
    import httpx

    parts = {
        "trainer_log": run_dir / "trainer_log.jsonl",
        "memory": memory,
        "config": run_dir / "train.yaml",
        "log": run_dir / "running_log.txt",
    }
    with ExitStack() as opened:
        upload = {}
        for field, path in parts.items():
            f = _regular(path) if path is not None else None
            if f is not None and path is not None:
                upload[field] = (path.name, opened.enter_context(f))  # streamed as it is sent
        if "trainer_log" not in upload:
            typer.echo(f"error: {parts['trainer_log']} not found", err=True)
            raise typer.Exit(2)
        # A long run takes the server a while to store: wait for it (a retry would only wait for the
        # same job), but not for a server that does not answer the connection.
        try:
            with client(server, timeout=httpx.Timeout(30, read=None)) as c:
                r = c.post("/api/runs/import", files=upload, data={"name": name})
        except httpx.HTTPError as e:
            raise unreachable(e) from None
    if r.status_code >= 400:
        raise refused(r)
    job = r.json()
    again = "; the same files were imported before: no new job" if r.status_code == 200 else ""
    typer.echo(f"imported as job {job['id']} ({job['status']}){again}")


def compare(
    job_ids: Annotated[list[int], typer.Argument(help="two or more jobs")],
    as_json: JsonOpt = False,
    server: ServerOpt = None,
) -> None:
    """Compare jobs: the config keys that differ (whole values), and where each ended (step, loss, eval loss, tokens/s)."""
    found = call(server, "GET", "/api/compare", params={"jobs": ",".join(map(str, job_ids))})
    if as_json:
        _dump(found)
        return
    for line in comparison(found):
        typer.echo(line)


def comparison(found: dict) -> list[str]:
    """`GET /api/compare`'s answer as a table: a row per differing key, then each job's end.

    Each column is as wide as its widest value: nothing is cut (two dataset folders that share a
    long prefix still print differently)."""
    ids = [str(j["id"]) for j in found["jobs"]]
    rows = [(k, [_whole(d.get(j)) for j in ids]) for k, d in found["differ"].items()]
    for k in ("step", "loss", "eval_loss", "grad_norm", "throughput"):
        ends = [j["last"][k] for j in found["jobs"]]
        rows.append((f"last {k}", ["" if v is None else format(v, ".6g") for v in ends]))
    head = [f"job {j}" for j in ids]
    label = max(len(k) for k, _ in rows)
    widths = [max([len(head[i])] + [len(vs[i]) for _, vs in rows]) for i in range(len(ids))]
    lines = [" " * label + "".join(f"  {h:>{w}}" for h, w in zip(head, widths))]
    lines += [f"{k:<{label}}" + "".join(f"  {v:>{w}}" for v, w in zip(vs, widths)) for k, vs in rows]
    return lines


def _whole(value: Any) -> str:
    """A config value as one line, nothing cut: a string as it is, anything else as JSON."""
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def register(app: typer.Typer) -> None:
    for verb in (metrics, alerts, config, files, checkpoints, download, resume, clone, rm, tag, compare):
        app.command(verb.__name__)(verb)
    app.command("import")(import_run)

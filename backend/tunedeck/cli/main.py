"""`tunedeck serve | submit | jobs | show | logs | cancel | demo`, and the verbs registered below."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunedeck.cli.http import call
from tunedeck.config import Settings, get_settings

app = typer.Typer(help="tunedeck: launch and monitor LLaMA-Factory fine-tunes.", no_args_is_help=True)
ServerOpt = Annotated[
    Optional[str], typer.Option("--server", help="server URL (default from TUNEDECK_* settings)")
]


_call = call  # the name the verbs below were written with


def _line(job: dict) -> str:
    p = job.get("progress") or {}
    prog = f"{p['current_steps']}/{p['total_steps']}" if p.get("total_steps") else "-"
    line = f"{job['id']:>5}  {job['status']:<10} {prog:>11}  gpus={job['gpus']}  priority={job.get('priority', 0)}"
    if job.get("pinned"):
        line += f"  devices={','.join(map(str, job['pinned']))}"
    line += f"  {job['name']}"
    if job.get("queue_position") is not None:  # a queued job: its place in line and what it waits for
        line += f"  (#{job['queue_position']} in line: {job.get('waiting_for') or '-'})"
    return line


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    """--env KEY=VALUE options as a mapping (exit 2, naming it, for one without `=`)."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            typer.echo(f"error: --env {pair!r}: give KEY=VALUE", err=True)
            raise typer.Exit(2)
        env[key] = value
    return env


def _device_ids(text: str | None) -> list[int] | None:
    """--devices 0,1 as GPU ids (exit 2 for anything but numbers)."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        typer.echo(f"error: --devices {text!r}: give GPU ids separated by commas (0,1)", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="bind address (TUNEDECK_HOST)")] = None,
    port: Annotated[Optional[int], typer.Option(help="bind port (TUNEDECK_PORT)")] = None,
) -> None:
    """Run the dashboard server."""
    from tunedeck.api.auth import writes_are_safe

    settings = _settings(host=host, port=port)
    if why := writes_are_safe(settings):
        typer.echo(f"error: {why}", err=True)
        raise typer.Exit(2)
    _run_server(*_listen(settings))


class _QuietAccess:
    """Drop access-log lines of runner telemetry and streams: one per job every half second is noise."""

    def filter(self, record) -> bool:
        return not any(p in record.getMessage() for p in ("/telemetry ", "/api/stream"))


def _listen(settings: Settings) -> tuple[Settings, socket.socket]:
    """The server's socket, bound before the app is built, and the settings naming the port bound:
    with TUNEDECK_PORT=0 the system picks a free one, and every URL (the one printed, the one each
    runner is given) must name that port, not 0."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host, settings.port), family=family)
    except OSError as e:
        typer.echo(f"error: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    port = sock.getsockname()[1]
    return (settings if port == settings.port else settings.model_copy(update={"port": port})), sock


def _run_server(settings: Settings, sock: socket.socket) -> None:
    import gc
    import logging

    # Start-up allocates much and frees almost nothing: collections during it only cost time, and
    # what it made (modules, classes, routes) never needs collecting again.
    gc.disable()
    try:
        import uvicorn

        from tunedeck.main import create_app
        from tunedeck.store.db import check_file

        # One clear line, not a traceback from the lifespan; the whole file is read beside serving
        # unless TUNEDECK_INTEGRITY_CHECK=start.
        if why := check_file(settings.db_path, deep=settings.integrity_check == "start"):
            typer.echo(f"error: {why}", err=True)
            raise typer.Exit(2)
        app = create_app(settings, db_checked=True)
    finally:
        gc.freeze()
        gc.enable()
    logging.getLogger("uvicorn.access").addFilter(_QuietAccess())
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info")
    # Given a socket, uvicorn names no address: this line does, with the port bound.
    typer.echo(f"serving on {settings.url} (bound to {settings.host}:{settings.port})")
    uvicorn.Server(config).run(sockets=[sock])


def _settings(**overrides) -> Settings:
    base = get_settings()
    update = {k: v for k, v in overrides.items() if v is not None}
    # Only what was given is passed on: a setting left at its default must stay unset (off loopback,
    # reads are open only where TUNEDECK_OPEN_READ was given).
    return Settings(**{**base.model_dump(include=base.model_fields_set), **update}) if update else base


@app.command()
def submit(
    file: Annotated[Optional[Path], typer.Argument(help="a LLaMA-Factory train YAML", exists=True)] = None,
    preset: Annotated[
        Optional[str], typer.Option(help="a job preset (GET /api/presets) instead of a file")
    ] = None,
    name: Annotated[Optional[str], typer.Option(help="job name (default: file or preset name)")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs for the job; 0 = CPU")] = None,
    deepspeed: Annotated[Optional[str], typer.Option(help="DeepSpeed preset name or JSON file")] = None,
    server: ServerOpt = None,
    kind: Annotated[str, typer.Option(help="train | eval | predict | export | chat")] = "train",
    nodes: Annotated[int, typer.Option(help="nodes the job spans, --gpus on each (ray executor)")] = 1,
    priority: Annotated[int, typer.Option(help="0-10: higher starts first (equal: in submit order)")] = 0,
    devices: Annotated[
        Optional[str], typer.Option(help="exactly these GPU ids, e.g. 0,1 (the job waits for them)")
    ] = None,
    env: Annotated[
        Optional[list[str]],
        typer.Option("--env", help="KEY=VALUE for the trainer (NCCL_*, HSA_*, ...), repeatable"),
    ] = None,
) -> None:
    """Submit a fine-tune (or an eval, predict, export or chat job) from a YAML file or a preset."""
    from tunedeck.checks.spec import load_yaml

    if file is not None and preset is None:
        text, default_name = file.read_text(), file.stem
    elif preset is not None and file is None:
        text, default_name = _call(server, "GET", f"/api/presets/{preset}")["text"], preset
    else:
        typer.echo("give either FILE or --preset", err=True)
        raise typer.Exit(2)
    config = load_yaml(text)
    ds = deepspeed if deepspeed is not None else config.pop("deepspeed", None)
    if deepspeed is not None:
        config.pop("deepspeed", None)
    if isinstance(ds, str) and ds.endswith(".json") and Path(ds).is_file():
        ds = json.loads(Path(ds).read_text())  # a local file travels inline
    job = _call(
        server,
        "POST",
        "/api/jobs",
        json={
            "name": name or default_name,
            "kind": kind,
            "config": config,
            "deepspeed": ds,
            "gpus": gpus,
            "nodes": nodes,
            "priority": priority,
            "env": _env_pairs(env),
            **({"devices": ids} if (ids := _device_ids(devices)) is not None else {}),
        },
    )
    for w in job.get("warnings", []):
        typer.echo(f"warning: {w}", err=True)
    for f in job.get("findings", []):  # lint warnings and notes
        typer.echo(f"{f['severity']}: {f['code']} {f['path']}: {f['message']} (fix: {f['fix']})", err=True)
    typer.echo(f"submitted job {job['id']} ({job['status']})")
    if kind == "chat":
        typer.echo(chat_note(_call(server, "GET", "/api/health"), job["id"]), err=True)


def chat_note(health: dict, job_id: int) -> str:
    """What a chat job holds and for how long, from the server's own settings (`/api/health`)."""
    idle = health["chat_idle_s"]
    span = f"{idle / 60:g} minutes" if idle >= 60 else f"{idle:g} s"
    slot = "the only CPU slot" if health["cpu_slots"] == 1 else "a CPU slot"
    return (
        f"note: a chat job holds its GPUs (or {slot} on CPU) until it is stopped "
        f"(tunedeck cancel {job_id}) or has had no request for {span} (TUNEDECK_CHAT_IDLE_S)"
    )


@app.command()
def priority(
    job_id: int,
    value: Annotated[int, typer.Argument(help="0-10: higher starts first")],
    server: ServerOpt = None,
) -> None:
    """Change a queued job's priority (its owner or an admin)."""
    job = _call(server, "PATCH", f"/api/jobs/{job_id}", json={"priority": value})
    typer.echo(_line(job))


@app.command()
def jobs(
    status: Annotated[Optional[str], typer.Option(help="only jobs in this status")] = None,
    q: Annotated[Optional[str], typer.Option("--q", help="a substring of the name or notes")] = None,
    owner: Annotated[Optional[str], typer.Option(help="only this owner's jobs")] = None,
    tag: Annotated[Optional[str], typer.Option(help="only jobs with this tag")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
    server: ServerOpt = None,
) -> None:
    """List jobs, newest first: every page of them."""
    params = {k: v for k, v in (("status", status), ("q", q), ("owner", owner), ("tag", tag)) if v}
    found: list[dict] = []
    while True:
        page = _call(server, "GET", "/api/jobs", params=params)
        found += page["jobs"]
        if page["next"] is None:
            break
        params["after"] = page["next"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for job in found:
        typer.echo(_line(job))


@app.command()
def show(job_id: int, server: ServerOpt = None) -> None:
    """Show one job as JSON."""
    typer.echo(json.dumps(_call(server, "GET", f"/api/jobs/{job_id}"), indent=2))


@app.command()
def logs(
    job_id: int,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object per line (stream, time, text)")
    ] = False,
    grep: Annotated[
        str | None, typer.Option("--grep", help="only lines holding this text (any case)")
    ] = None,
    server: ServerOpt = None,
) -> None:
    """Print a job's output; --follow keeps printing until the job ends."""
    after, ended = None, False
    while True:
        params = {k: v for k, v in {"after": after, "q": grep}.items() if v}
        page = _call(server, "GET", f"/api/jobs/{job_id}/logs", params=params)
        for line in page["lines"]:
            typer.echo(json.dumps(line) if as_json else line["text"])
        after = page["next"]
        if not follow and not page["lines"]:
            return
        if not page["lines"]:
            if ended:
                return
            # The last lines may be stored just before the end is: one more read after it takes them.
            ended = _call(server, "GET", f"/api/jobs/{job_id}")["status"] not in ("queued", "running")
            if not ended:
                time.sleep(1)


@app.command()
def cancel(job_id: int, server: ServerOpt = None) -> None:
    """Stop a job (gracefully: LLaMA-Factory saves before it stops)."""
    typer.echo(_line(_call(server, "POST", f"/api/jobs/{job_id}/cancel")))


@app.command()
def demo(
    no_submit: Annotated[
        bool, typer.Option("--no-submit", help="only build the demo model and data")
    ] = False,
    host: Annotated[Optional[str], typer.Option(help="bind address when the server is started here")] = None,
    port: Annotated[Optional[int], typer.Option(help="bind port when the server is started here")] = None,
) -> None:
    """Build a tiny local model and dataset, then run the dashboard with a demo fine-tune in it."""
    settings = _settings(host=host, port=port)
    # The build needs torch: it runs in the training environment, never in this process.
    out = subprocess.run(
        [
            str(settings.train_python),
            "-m",
            "tunedeck_train.demo",
            "build",
            "--workspace",
            str(settings.workspace),
        ],
        check=False,
        stdout=subprocess.PIPE,
        text=True,
    )
    if out.returncode != 0:
        typer.echo("building the demo assets failed", err=True)
        raise typer.Exit(out.returncode)
    typer.echo(f"demo assets in {settings.workspace / 'demo'}")
    if no_submit:
        return
    import httpx

    def answers(url: str) -> bool:
        try:
            httpx.get(f"{url}/api/health", timeout=2).raise_for_status()
            return True
        except httpx.HTTPError:
            return False

    # A server already on the port gets the demo job; otherwise one starts here, on the port it
    # binds (TUNEDECK_PORT=0: a free one), and every URL printed names that port.
    running = settings.port != 0 and answers(settings.url)
    sock = None
    if not running:
        settings, sock = _listen(settings)
    url = settings.url

    def submit_when_up() -> None:
        for _ in range(600):
            if answers(url):
                break
            time.sleep(0.2)
        try:
            submit(file=None, preset="demo_cpu", name="demo", gpus=None, deepspeed=None, server=url)
            typer.echo(f"dashboard: {url}   API docs: {url}/docs")
        except typer.Exit:
            typer.echo(f"submitting the demo job to {url} failed", err=True)

    if sock is None:
        submit_when_up()
        return
    threading.Thread(target=submit_when_up, daemon=True).start()
    _run_server(settings, sock)


token_app = typer.Typer(
    help="Bearer tokens for people and scripts (run on the server host).", no_args_is_help=True
)
db_app = typer.Typer(help="The server's SQLite database.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")


def _engine():
    from tunedeck.store.db import check_file, make_engine, upgrade

    settings = get_settings()
    if why := check_file(settings.db_path, deep=settings.integrity_check == "start"):
        typer.echo(f"error: {why}", err=True)
        raise typer.Exit(2)
    engine = make_engine(settings.db_path)
    upgrade(engine)
    return engine


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="who holds it (becomes the owner of their jobs)")],
    role: Annotated[str, typer.Option(help="viewer | submitter | admin")] = "submitter",
) -> None:
    """Create a token; it is printed once, only its hash is kept."""
    from sqlmodel import Session

    from tunedeck.api.auth import Role, create_token

    try:
        r = Role(role)
    except ValueError:
        typer.echo("error: role: must be viewer, submitter or admin", err=True)
        raise typer.Exit(2) from None
    with Session(_engine()) as session:
        try:
            typer.echo(create_token(session, name=name, role=r))
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None


@token_app.command("list")
def token_list() -> None:
    """List tokens (never their values)."""
    from sqlmodel import Session

    from tunedeck.api.auth import list_tokens

    with Session(_engine()) as session:
        for t in list_tokens(session):
            state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
            typer.echo(f"{t.name:<24} {t.role:<10} {state:<26} created {t.created_at:%Y-%m-%d %H:%M}")


@token_app.command("revoke")
def token_revoke(name: str) -> None:
    """Revoke every active token of this name."""
    from sqlmodel import Session

    from tunedeck.api.auth import revoke_token

    with Session(_engine()) as session:
        n = revoke_token(session, name=name)
    if not n:
        typer.echo(f"error: no active token named {name!r}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {n} token(s) named {name}")


@db_app.command("backup")
def db_backup(path: Path) -> None:
    """Copy the database with SQLite's online backup: safe while the server runs."""
    import sqlite3

    src = get_settings().db_path
    if not src.exists():
        typer.echo(f"error: no database at {src}", err=True)
        raise typer.Exit(1)
    if path.exists():
        typer.echo(f"error: {path} exists; choose a new file", err=True)
        raise typer.Exit(1)
    with sqlite3.connect(src) as a, sqlite3.connect(path) as b:
        a.backup(b)
        ok = b.execute("PRAGMA integrity_check").fetchone()[0]
    typer.echo(f"backed up {src} to {path} ({path.stat().st_size} bytes, integrity {ok})")


@db_app.command("restore")
def db_restore(
    backup: Annotated[
        Path, typer.Argument(help="a file made by `tunedeck db backup`", exists=True, dir_okay=False)
    ],
) -> None:
    """Put a backup in place of the database (run with the server stopped); the old file is kept aside."""
    import sqlite3
    import time
    from contextlib import closing

    from tunedeck.store.db import check_file, damage_marker

    if why := check_file(backup):
        typer.echo(f"error: the backup is not usable either: {why.split('; ')[0]}", err=True)
        raise typer.Exit(1)
    dst = get_settings().db_path
    kept = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # The WAL and shared-memory files belong to the old file: replayed onto the backup they would damage it.
    for f in (dst, dst.with_name(dst.name + "-wal"), dst.with_name(dst.name + "-shm")):
        if f.exists():
            aside = f.with_name(f"{f.name}.replaced-{stamp}")
            f.rename(aside)
            kept.append(str(aside))
    dst.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(backup)) as a, closing(sqlite3.connect(dst)) as b:
        a.backup(b)
    damage_marker(dst).unlink(missing_ok=True)  # what the old file's check found is not this one's
    typer.echo(
        f"restored {backup} to {dst}" + (f"; the old files are kept as {', '.join(kept)}" if kept else "")
    )


@db_app.command("check")
def db_check() -> None:
    """Read the whole database file now (SQLite's quick_check; safe while serving): "ok", or the damage
    found, which later starts then refuse until `tunedeck db restore`."""
    import time

    from tunedeck.store.db import damage_marker, quick_check

    path = get_settings().db_path
    if not path.exists():
        typer.echo(f"error: no database at {path}", err=True)
        raise typer.Exit(2)
    t0 = time.monotonic()
    try:
        found = quick_check(path)
    except OSError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    took = time.monotonic() - t0
    if found is None:
        damage_marker(path).unlink(missing_ok=True)  # what an earlier check or request met is gone
        typer.echo(f"ok: {path} ({path.stat().st_size / 2**20:.1f} MiB read in {took:.1f} s)")
        return
    damage_marker(path).write_text(found + "\n")
    typer.echo(f"damaged: {path}: {found}; put back a copy with `tunedeck db restore BACKUP_FILE`", err=True)
    raise typer.Exit(1)


@db_app.command("vacuum")
def db_vacuum() -> None:
    """Rewrite the database compactly, with its free pages given back and (for a file made before
    tunedeck did so) incremental vacuum turned on, so later retention shrinks it as it goes. Stop the
    server first: the rewrite holds the file, and needs free disk about the file's size."""
    import sqlite3
    import time
    from contextlib import closing

    path = get_settings().db_path
    if not path.exists():
        typer.echo(f"error: no database at {path}", err=True)
        raise typer.Exit(2)
    before = path.stat().st_size
    t0 = time.monotonic()
    try:
        with closing(sqlite3.connect(path, timeout=5, isolation_level=None)) as conn:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError as e:
        typer.echo(f"error: {e} (is the server still running? stop it first)", err=True)
        raise typer.Exit(1) from None
    after = path.stat().st_size
    typer.echo(
        f"vacuumed {path}: {before / 2**20:.1f} MiB → {after / 2**20:.1f} MiB in {time.monotonic() - t0:.1f} s; "
        "freed pages now go back to the disk as retention frees them"
    )


@db_app.command("rollup")
def db_rollup(
    older_than_days: Annotated[
        Optional[float],
        typer.Option(
            help="roll up jobs that ended this many days ago (default TUNEDECK_MEMORY_RAW_RETENTION_DAYS)"
        ),
    ] = None,
) -> None:
    """Drop the raw memory samples of long-ended jobs now (their chart tiles stay)."""
    from tunedeck.services.ingest.retention import rollup

    settings = get_settings()
    days = older_than_days if older_than_days is not None else settings.memory_raw_retention_days
    if days is None:
        typer.echo("error: older-than-days: give a number (retention is off in the settings)", err=True)
        raise typer.Exit(2)
    report = rollup(_engine(), older_than_s=days * 86400, interval_s=settings.memory_rollup_s)
    typer.echo(f"rolled up {report['jobs']} job(s): {report['before']} samples → {report['after']}")


# `tunedeck lint | estimate | doctor` (checks before launch, run locally)
from tunedeck.cli.checks import register as _register_checks

_register_checks(app)

# `tunedeck metrics | alerts | config | files | download | checkpoints | resume | clone | rm | tag |
# import | compare` (a job's lifecycle and data, through the server)
from tunedeck.cli.jobs import register as _register_jobs

_register_jobs(app)

# `tunedeck datasets list | add | preview`, `tunedeck models` (datasets and local models, through the server)
from tunedeck.cli.datasets import register as _register_datasets

_register_datasets(app)

# `tunedeck analyze RUN_DIR` (alerts for a run tunedeck did not launch)
from tunedeck.cli.analyze import register as _register_analyze

_register_analyze(app)

# `tunedeck presets list | save | delete` (the shipped presets and the team's, through the server)
from tunedeck.cli.presets import presets_app as _presets_app

app.add_typer(_presets_app, name="presets")


if __name__ == "__main__":
    app()

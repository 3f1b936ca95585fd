"""A server start loads only what serving needs: Alembic only when the database is behind, the HTTP
client only for a webhook or a CLI command, the Prometheus client only when scraped, PyYAML only for a
job's YAML. Checked in fresh interpreters, where imports are real."""

from __future__ import annotations

import json
import subprocess

from alembic.script import ScriptDirectory

from tests.utils.servers import PYTHON
from tunedeck.store.db import MIGRATIONS_DIR, downgrade, make_engine, script_heads, upgrade


def loaded_after(code: str, *modules: str) -> dict:
    """Runs `code` in a new interpreter; which of `modules` it left imported, and what it printed."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps({{m: m in sys.modules for m in {modules!r}}}))"
    out = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def version(db) -> set[str]:
    import sqlite3

    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT version_num FROM alembic_version")}


def test_heads_read_from_the_files_are_alembics():
    assert script_heads() == set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())


def test_a_restart_at_head_loads_neither_alembic_nor_the_http_client(tmp_path):
    db = tmp_path / "m.db"
    upgrade(make_engine(db))
    code = (
        "from pathlib import Path\nimport tunedeck.cli.main\nfrom tunedeck.store.db import make_engine, upgrade\n"
        f"from tunedeck.main import create_app\nupgrade(make_engine(Path({str(db)!r})))\ncreate_app()"
    )
    found = loaded_after(code, "alembic", "httpx", "ray", "prometheus_client", "yaml")
    # Ray: only with the ray executor; prometheus_client: at the first scrape; PyYAML: at the first spec
    assert found == {
        "alembic": False,
        "httpx": False,
        "ray": False,
        "prometheus_client": False,
        "yaml": False,
    }
    assert version(db) == script_heads()


def test_a_database_behind_is_still_migrated(tmp_path):
    db = tmp_path / "m.db"
    engine = make_engine(db)
    upgrade(engine)
    downgrade(engine, "0007_jobs_finished")
    assert version(db) == {"0007_jobs_finished"}
    upgrade(engine)
    assert version(db) == script_heads()


def test_the_first_health_check_builds_no_other_router(app_factory):
    # FastAPI builds an included router's routes on the first request that reaches it, trying them in
    # order: a health check that came after the job routers paid for building them all.
    from tunedeck.api import system

    app = app_factory()
    assert app.api.get("/api/health").status_code == 200
    built = [
        r.original_router
        for r in app.app.router.routes
        if getattr(r, "_effective_candidates_version", None) is not None
    ]
    assert built == [system.router]


def test_a_start_checks_the_database_file_once(tmp_path, assets):
    # The check is a quick_check, which reads every page: seconds on a long history, paid at each pass.
    from tests.utils.servers import Server

    upgrade(make_engine(tmp_path / "ws" / "tunedeck.db"))
    server = Server(tmp_path / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true")
    log = tmp_path / "checks.log"
    # Only check_file opens the database read-write by URI; the audit hook sees every opening.
    hook = (
        f"import sys\nlog = open({str(log)!r}, 'a')\n"
        "sys.addaudithook(lambda e, a: e == 'sqlite3.connect' and 'mode=rw' in str(a[0]) "
        "and (log.write(str(a[0]) + '\\n'), log.flush()))\n"
        "from tunedeck.cli.main import app\napp(['serve'])"
    )
    server.command = [PYTHON, "-c", hook]
    try:
        server.start()
    finally:
        server.stop()
    assert len(log.read_text().splitlines()) == 1

"""Engine, SQLite pragmas on connect, Alembic upgrade at start, and the session dependency."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from tunedeck.config import WAL_LIMIT_BYTES

MIGRATIONS_DIR = Path(str(resources.files("tunedeck.migrations")))


def private(*paths: Path) -> None:
    """Mode 0600: the database holds token hashes and every job's config and output."""
    for p in paths:
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except OSError:  # not there (yet), or not ours: nothing to tighten
            pass


def make_engine(db_path: Path, *, busy_timeout_s: float = 30.0) -> Engine:
    db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = create_engine(
        f"sqlite:///{db_path}",
        connect_args={"check_same_thread": False, "timeout": busy_timeout_s},
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        # Only a new file (no page yet) is told this, before the WAL switch writes its header: its freed
        # pages can then be given back (services/ingest/upkeep.py). On a file that has pages, setting it
        # opens a write transaction, and a connection opened while another program held the lock would
        # wait out the busy timeout before its first read.
        if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()
        # SQLite gives a new WAL and shared-memory file the main file's mode.
        private(db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm"))

    return engine


_REVISION = re.compile(r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(.+?)\s*(?:#.*)?$", re.M)
_NAME = re.compile(r"""^(?:"([^"]*)"|'([^']*)'|None)$""")


def script_heads() -> set[str] | None:
    """The newest revisions in `migrations/versions`, read from the files' text (so a start at head
    needs no Alembic); None when a file says something this reading does not follow."""
    revs, parents = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = {m.group(1): m.group(2) for m in _REVISION.finditer(path.read_text())}
        rev, down = (_NAME.match(found.get(k, "")) for k in ("revision", "down_revision"))
        if rev is None or down is None or rev.group(0) == "None":
            return None
        revs.add(next(g for g in rev.groups() if g is not None))
        parents |= {g for g in down.groups() if g is not None}
    return revs - parents or None


def at_head(engine: Engine) -> bool:
    heads = script_heads()
    try:
        with engine.connect() as conn:
            stamped = {r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))}
    except OperationalError:  # a new database: no version table yet
        return False
    return heads is not None and stamped == heads


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply Alembic migrations: the schema is owned by `migrations/`, never by create_all."""
    if revision == "head" and at_head(engine):
        return  # the usual restart: Alembic (a third of a start's imports) is not loaded at all
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


RESTORE_HINT = "put back a copy made with `tunedeck db backup` (`tunedeck db restore BACKUP_FILE`)"


def damage_marker(db_path: Path) -> Path:
    """Left beside the database when a full check found it damaged: later starts refuse it at once,
    until `tunedeck db restore` puts a good copy in its place (and removes the marker)."""
    return db_path.with_name(db_path.name + ".damaged")


def check_file(db_path: Path, *, deep: bool = True) -> str | None:
    """Why the server must not open this database (None when it may): a file that exists is never
    replaced, even an empty one, and a damaged one is refused before anything writes to it.

    `deep`: SQLite's quick_check, which reads every page (1–5 s of CPU per GiB); otherwise the
    header and the schema only, and what an earlier full check found (damage_marker): the full check
    then runs beside the serving server (services/ingest/storage.IntegrityCheck)."""
    if not db_path.exists():
        return None  # the first start creates it
    if db_path.is_file() and db_path.stat().st_size == 0:
        return (
            f"database {db_path} exists but is empty (0 bytes), so its tokens and jobs are gone; "
            f"{RESTORE_HINT}, or delete the file to start a new database"
        )
    try:
        found = damage_marker(db_path).read_text().strip()
    except OSError:
        found = ""
    if found:
        return (
            f"database {db_path} is damaged ({found}, found while serving); {RESTORE_HINT} "
            f"(`tunedeck db check` reads it again, and removes {damage_marker(db_path).name} if it is sound)"
        )
    try:
        with closing(sqlite3.connect(db_path.absolute().as_uri() + "?mode=rw", uri=True)) as conn:
            if deep:
                rows = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
            else:  # the header and the schema's pages: a foreign or headless file fails here
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                rows = ["ok"]
    except (
        sqlite3.OperationalError
    ) as e:  # permissions, a read-only folder, a lock: the file itself may be fine
        return f"database {db_path} cannot be opened ({e}): check the file, its folder and its permissions"
    except sqlite3.DatabaseError as e:
        return f"database {db_path} is damaged or not a database ({e}); {RESTORE_HINT}"
    if rows != ["ok"]:
        return f"database {db_path} is damaged (quick_check: {_said(rows)}); {RESTORE_HINT}"
    return None


def _said(rows: list[str]) -> str:
    return " ".join(" ".join(rows).split())[:300]


def quick_check(db_path: Path) -> str | None:
    """SQLite's quick_check of the whole file, read-only (beside a serving server: WAL readers do not
    block its writers): what it found, or None when the file is sound."""
    try:
        with closing(sqlite3.connect(db_path.absolute().as_uri() + "?mode=ro", uri=True)) as conn:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
    except sqlite3.OperationalError as e:
        raise OSError(f"cannot read {db_path.name}: {e}") from None
    except sqlite3.DatabaseError as e:
        return str(e)
    return None if rows == ["ok"] else f"quick_check: {_said(rows)}"


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def engine_of(session: Session) -> Engine:
    """The engine a session is bound to: every session here is made on one (never on a connection),
    and the chart reads need it for a raw connection and transactions of their own."""
    bind = session.get_bind()
    assert isinstance(bind, Engine), bind
    return bind

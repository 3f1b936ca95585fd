"""Engine, SQLite pragmas on connect, Alembic upgrade at start, and the session dependency."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine, create_engine, event
from sqlmodel import Session

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def private(*paths: Path) -> None:
    """Mode 0600: the database holds token hashes and every job's config and output."""
    for p in paths:
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except OSError:  # not there (yet), or not ours: nothing to tighten
            pass


def make_engine(db_path: Path) -> Engine:
    db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = create_engine(
        f"sqlite:///{db_path}",
        connect_args={"check_same_thread": False, "timeout": 30},
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()
        # SQLite gives a new WAL and shared-memory file the main file's mode.
        private(db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm"))

    return engine


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Apply Alembic migrations: the schema is owned by `migrations/`, never by create_all."""
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


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

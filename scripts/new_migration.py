"""Write a new Alembic revision: `make migration MSG="what changes"`.

Autogenerates against the tables (`tunedeck.store.tables`) from a scratch database upgraded to the
newest revision, so the file holds what the tables have and the history lacks. The revision id is
the next number of the one linear history (0019 after 0018); the file lands in migrations/versions/.
Read it before committing: autogenerate misses renames and server defaults, and a migration keeps its
own copy of any constant it needs (DEVELOPERS.md, "Migrations").
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import Script, ScriptDirectory

from tunedeck.store.db import MIGRATIONS_DIR, make_engine, upgrade


def main(message: str, migrations: Path = MIGRATIONS_DIR) -> Path:
    if not message.strip():
        raise SystemExit('usage: make migration MSG="what changes"')
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    if head is None:
        raise SystemExit(f"{migrations} holds no revision to follow")
    rev_id = f"{int(head) + 1:04d}"
    slug = re.sub(r"[^a-z0-9]+", "_", message.lower()).strip("_")[:40]
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(Path(tmp) / "scratch.db")
        upgrade(engine)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            script = command.revision(cfg, message=message, autogenerate=True, rev_id=rev_id)
        engine.dispose()
    if not isinstance(script, Script):  # one revision asked for: one written
        raise SystemExit(f"alembic wrote {script!r}, not one revision")
    path = Path(script.path)
    final = path.with_name(f"{rev_id}_{slug}.py")
    path.rename(final)
    print(final)
    return final


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]))

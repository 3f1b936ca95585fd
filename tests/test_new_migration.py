"""`make migration MSG=...` (scripts/new_migration.py) writes the next revision of the one line, by
autogenerate against the tables: on today's tables it finds nothing to change."""

from __future__ import annotations

import importlib.util
import shutil

from tests.utils.servers import ROOT


def test_a_new_revision_follows_the_head_and_finds_the_tables_and_history_agree(tmp_path):
    spec = importlib.util.spec_from_file_location("new_migration", ROOT / "scripts" / "new_migration.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    migrations = shutil.copytree(ROOT / "migrations", tmp_path / "migrations")
    heads = sorted(p.name[:4] for p in (migrations / "versions").glob("[0-9]*.py"))
    path = script.main("Add a thing", migrations=migrations)
    text = path.read_text()
    assert path.parent == migrations / "versions" and path.name == f"{int(heads[-1]) + 1:04d}_add_a_thing.py"
    assert f'down_revision = "{heads[-1]}"' in text.replace("'", '"')
    # Nothing differs between the tables and the history, so both steps are empty.
    assert text.count("    pass\n") == 2, text

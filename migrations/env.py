"""Alembic environment: tunedeck passes its own connection (see tunedeck.store.db.upgrade)."""

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import tunedeck.store.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from tunedeck.store.legacy_heads import fold_version_rows

connection = context.config.attributes.get("connection")
if connection is None:  # run from the alembic CLI: TUNEDECK_DATABASE or the default workspace
    from tunedeck.config import get_settings

    connection = create_engine(f"sqlite:///{get_settings().db_path}").connect()

# render_as_batch: SQLite can only ALTER through table copies.
context.configure(connection=connection, target_metadata=SQLModel.metadata, render_as_batch=True)
with context.begin_transaction():
    # Before any command reads them, so the CLI meets a one-line history too.
    fold_version_rows(connection, context.get_context().get_current_heads())
    context.run_migrations()

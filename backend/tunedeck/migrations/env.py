"""Alembic environment: tunedeck passes its own connection (see tunedeck.db.upgrade)."""

from alembic import context
from sqlalchemy import create_engine

connection = context.config.attributes.get("connection")
if connection is None:  # run from the alembic CLI: TUNEDECK_DATABASE or the default workspace
    from tunedeck.config import get_settings

    connection = create_engine(f"sqlite:///{get_settings().db_path}").connect()

# render_as_batch: SQLite can only ALTER through table copies.
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

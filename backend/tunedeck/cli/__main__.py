"""`python -m tunedeck.cli` runs the CLI."""

from tunedeck.cli.main import app

app()

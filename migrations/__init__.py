"""Alembic migrations, one linear history: a top-level folder of the checkout, shipped in the wheel as
`tunedeck.migrations` so a plain install migrates its database."""

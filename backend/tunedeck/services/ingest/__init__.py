"""services/ingest."""

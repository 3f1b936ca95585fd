"""services/live."""

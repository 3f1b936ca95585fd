"""services/jobs."""

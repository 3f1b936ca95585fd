"""services/views."""

"""services/charts."""

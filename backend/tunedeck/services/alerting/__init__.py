"""services/alerting."""

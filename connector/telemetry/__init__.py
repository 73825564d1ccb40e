"""Observability: one structured log line per lifecycle event, and the Prometheus metrics of the connector."""

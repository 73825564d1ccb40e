"""Tests of the connector service (HTTP API over the assembled connector)."""

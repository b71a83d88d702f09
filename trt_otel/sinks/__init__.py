"""Projections that leave the process: Prometheus (and, as they land, OTLP and HTTP)."""

"""Deciding when a build stops: cancel policies and signals."""

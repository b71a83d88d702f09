"""The package's version, where every room can read it (the journal's header names its producer)."""

__version__ = "0.1.0"

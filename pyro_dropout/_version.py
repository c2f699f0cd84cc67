"""The package version (a module of its own, so that any layer can record it)."""

__version__ = "0.1.0"

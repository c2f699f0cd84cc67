"""The warning of a loss that runs eagerly, or compiles more slowly, than ``fit`` would by
default (its own module: the compiled path and its lazily imported tracer both raise it)."""

__all__ = ["CompilationWarning"]


class CompilationWarning(UserWarning):
    """The loss could not be compiled (or its trace depends on the data) and runs eagerly, or
    compiles on a slower route; the message says why and what it costs."""

"""``python -m benchmarks.uci``: see :mod:`benchmarks.uci.cli`."""

from .cli import main

main()

"""``python -m pyro_dropout.benchmarks.uci``: see :mod:`pyro_dropout.benchmarks.uci.cli`."""

from .cli import main

main()

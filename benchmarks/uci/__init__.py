r"""UCI regression benchmark on the PBP / MC-dropout splits, for the guides of
:mod:`benchmarks.uci_model`.

    python -m benchmarks.uci --data-dir ../shared/data/uci --out uci-results \
        [--datasets yacht,bostonHousing,...] [--guides dropout,meanfield,vd,concrete] [--quick] \
        [--splits 0,1,...] [--epochs N] [--mc-samples T] [--val-mc-samples T] \
        [--split-batch K] [--threads 1] [--resume] [--estimate] [--report-only] \
        [--validate-single]

Outputs under ``--out``: ``units/<dataset>/<guide>/split_<k>.json`` (one per finished split:
every number, the settings, the validation scores of every configuration, the chosen
hyper-parameters, wall times) and ``split_<k>.val.json`` (the validation phase, so a resumed
run does not repeat it), ``summary.json`` and ``results.md`` (our guides next to the published
columns; reduced budgets marked †). ``--report-only`` trains nothing and rewrites
``summary.json`` and ``results.md`` from the finished units (pending datasets appear as "–").
``--estimate`` only times a few training steps and one Monte-Carlo chunk per phase and writes
``projection.json``/``projection.md`` with the projected wall time of the full protocol.
``--validate-single`` trains only the validation phase of a guide with one configuration (whose
runs skip it), as ``split_<k>.val.json`` beside its final units, so that its row gets a
validation LL (:mod:`~benchmarks.uci.validate_single`).

The protocol and the derivation of the dropout guide's likelihood precision and prior are in
:mod:`~benchmarks.uci.protocol`. The package, one concept per module:

* :mod:`~benchmarks.uci.protocol`: the protocol, its settings, budgets and seeds;
* :mod:`~benchmarks.uci.units`: unit files, resume, provenance;
* :mod:`~benchmarks.uci.run`: the validation and final phases of a unit;
* :mod:`~benchmarks.uci.validate_single`: ``--validate-single``, the validation phase of a
  one-configuration row run apart, and its units read back (checked) for the summary;
* :mod:`~benchmarks.uci.summary`: ``summary.json`` from the finished units;
* :mod:`~benchmarks.uci.report`: ``results.md`` (tables, targets);
* :mod:`~benchmarks.uci.compare`: issue 40's comparison rule (the best published Bayesian
  network against our row picked on validation LL);
* :mod:`~benchmarks.uci.estimate`: ``--estimate``'s projection;
* :mod:`~benchmarks.uci.cli`: the command line (``__main__`` runs it).
"""

from .cli import main, run
from .estimate import estimate
from .protocol import EPOCH_MULTIPLIER, FULL_MC_SAMPLES, QUICK, SCHEMA, protocol
from .report import _split_list as _split_list
from .report import _within as _within
from .report import markdown
from .run import _stack_split_arrays as _stack_split_arrays
from .run import run_dataset_guide
from .summary import summarize
from .units import UNRECORDED_COMMIT, commit_label

__all__ = [
    "EPOCH_MULTIPLIER",
    "FULL_MC_SAMPLES",
    "QUICK",
    "SCHEMA",
    "UNRECORDED_COMMIT",
    "commit_label",
    "estimate",
    "main",
    "markdown",
    "protocol",
    "run",
    "run_dataset_guide",
    "summarize",
]

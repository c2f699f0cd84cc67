r"""Batched Bayesian MLPs for the UCI benchmark: many hyper-parameter configurations (and
splits) trained together as one Pyro model, and streamed Monte-Carlo evaluation.

A run trains ``M`` independent *members* at once: member ``m`` is one (split, configuration)
pair. All weights live inside ``pyro.plate("members", M, dim=-2)``, so every weight site has
batch shape ``(M, 1)``; the guides give each member its own variational parameters, and the
Bayesian layers broadcast a member's weights over its own minibatch (inputs of shape
``(M, B, D)``). The members' objectives are independent sums, so one Adam step on the summed
loss is one Adam step of every member (Adam is element-wise, so a member's trajectory does not
depend on the others, nor on a constant factor in its own objective).

See :mod:`benchmarks.uci.protocol` for the protocol and the derivation of the
dropout guide's likelihood precision and prior.

Modules, one concept each: :mod:`.priors` (the priors and noise settings, the dropout guide's
training precision), :mod:`.network` (the batched regression MLP), :mod:`.configs` (the
guides and their hyper-parameter grids), :mod:`.members` (the members of a fit),
:mod:`.builders` (model and guide of each guide's members), :mod:`.training` (the training
loop), :mod:`.checkpoint` (a training's state across sittings), :mod:`.draw` (one vectorised Monte-Carlo draw) and :mod:`.evaluation` (the test
metrics).
"""

# The names the benchmark, its tests and tools read as ``uci_model.<name>``, re-exported from
# the modules that define them (``name as name``: a deliberate re-export, not an unused import).
from . import checkpoint as checkpoint
from .builders import _build_hetero as _build_hetero
from .builders import build
from .configs import GUIDES, GuideSpec
from .configs import HETERO_BASE as HETERO_BASE
from .configs import TAU_CALIBRATION_FACTORS as TAU_CALIBRATION_FACTORS
from .configs import grid as grid
from .draw import _Draw as _Draw
from .evaluation import _CHUNK_BUDGET as _CHUNK_BUDGET
from .evaluation import MC_DRAWS as MC_DRAWS
from .evaluation import Evaluation as Evaluation
from .evaluation import _eval_blocks as _eval_blocks
from .evaluation import evaluate
from .members import Members as Members
from .members import _expand_members as _expand_members
from .network import BatchedRegressionMLP
from .priors import DROPOUT_BIAS_PRIOR_SCALE as DROPOUT_BIAS_PRIOR_SCALE
from .priors import DROPOUT_SLAB_SCALE as DROPOUT_SLAB_SCALE
from .priors import HETERO_MIN_SCALE as HETERO_MIN_SCALE
from .priors import INIT_NOISE_SD as INIT_NOISE_SD
from .priors import LENGTH_SCALE, dropout_training_precision
from .priors import MEANFIELD_PRIOR_SCALES as MEANFIELD_PRIOR_SCALES
from .priors import VD_BIAS_PRIOR_SCALE as VD_BIAS_PRIOR_SCALE
from .training import _WARM_STEPS as _WARM_STEPS
from .training import FitStats as FitStats
from .training import train

__all__ = [
    "GUIDES",
    "LENGTH_SCALE",
    "BatchedRegressionMLP",
    "GuideSpec",
    "build",
    "dropout_training_precision",
    "evaluate",
    "train",
]

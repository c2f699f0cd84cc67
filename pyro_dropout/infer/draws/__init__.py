r"""Run a guide and replay a model on one or more data sets, draw by draw or vectorised: the
engine behind :func:`~pyro_dropout.predict`, the ArviZ export and ``compare``.

For each posterior draw :math:`\theta_s \sim q` the guide runs once and the model is replayed
on every data set (training and test inputs see the same :math:`\theta_s`). It works on any
Pyro model:

* **Vectorised when the model broadcasts.** Draws are taken in chunks inside a ``pyro.plate``
  left of the model's plates (as ``Predictive(parallel=True)``). The first draw runs alone and
  gives the per-draw shapes; a chunk whose results do not have them, or that raises (e.g. a
  ``MaxPool2d`` seeing a 5-D input), switches the run to one draw per pass, which gives the
  same distribution, with one :class:`VectorizationWarning` (at the caller's line, naming the
  exception; once per model in an entry point that runs it several times).
  ``vectorize=True`` makes that an error instead, ``vectorize=False`` skips the vectorised
  pass and the warning.
* **Every row, never a subsample.** A subsampled ``pyro.plate`` (``subsample_size=B``) is given
  every index in passes of exactly ``B`` indices (the last pass is completed with indices from
  the start, whose results are dropped), all replaying the same guide draw.
* **The observed site is found**: the one sample site of the model that the guide does not
  draw (deterministic and subsample sites aside). A model with several must name it.

The observed site's distribution is kept as its parameters (:class:`DistDraws`, shaped
``(S, N, ...)``), so ``log p(y_i | θ_s)`` and other quantities can be computed later for any
``y``.

The package, one step of the engine per module:

* :mod:`~pyro_dropout.infer.draws.sites`: which site is observed, which are latent;
* :mod:`~pyro_dropout.infer.draws.plates`: the draw plate, the model's plates, subsampled
  plates visited in full, the layout of a vectorised chunk;
* :mod:`~pyro_dropout.infer.draws.accumulate`: what is collected from the traces
  (:class:`DistDraws`, :class:`DrawRun`);
* :mod:`~pyro_dropout.infer.draws.run`: :func:`run_draws`, vectorised with the sequential
  fallback;
* :mod:`~pyro_dropout.infer.draws.verify`: the check that a vectorised pass gives what one
  draw alone gives (draws are not mistaken for rows);
* :mod:`~pyro_dropout.infer.draws.modes`: the model's modules in eval mode during a run, their
  modes and buffers restored afterwards.
"""

from .accumulate import OBS_SAMPLE, DistDraws, DrawRun
from .accumulate import _dist_params as _dist_params
from .plates import _DRAW_PLATE as _DRAW_PLATE
from .plates import NotVectorizable, SubsampleIndices, VectorizationWarning
from .run import CHUNK_ELEMENTS, run_draws
from .sites import RETURN_SITE, choose_obs_site
from .sites import is_improper as is_improper

__all__ = [
    "CHUNK_ELEMENTS",
    "DistDraws",
    "DrawRun",
    "NotVectorizable",
    "OBS_SAMPLE",
    "RETURN_SITE",
    "SubsampleIndices",
    "VectorizationWarning",
    "choose_obs_site",
    "run_draws",
]

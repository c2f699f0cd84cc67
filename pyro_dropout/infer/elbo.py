"""The ELBO that :func:`~pyro_dropout.infer.fit` and
:class:`~pyro_dropout.lightning.BayesianModule` train with: :func:`make_elbo` picks
:class:`~pyro_dropout.infer.MeanFieldELBO` (:mod:`pyro_dropout.infer.mean_field_elbo`) or its
compiled form :class:`~pyro_dropout.infer.JitMeanFieldELBO`
(:mod:`pyro_dropout.infer.compiled`)."""

from .compiled import JitMeanFieldELBO
from .mean_field_elbo import MeanFieldELBO

__all__ = ["JitMeanFieldELBO", "MeanFieldELBO", "make_elbo"]


def make_elbo(model, jit="auto", num_particles=1, vectorize_particles=False):
    """The ELBO ``fit`` trains with: :class:`MeanFieldELBO`, compiled
    (:class:`JitMeanFieldELBO`) unless ``jit=False``, eager with a warning where it cannot be
    compiled if ``jit="auto"``; with the model's ``max_plate_nesting`` when it declares one
    (Pyro guesses it otherwise)."""
    kwargs = dict(
        num_particles=num_particles,
        vectorize_particles=vectorize_particles,
        max_plate_nesting=getattr(model, "max_plate_nesting", float("inf")),
    )
    if not jit:
        return MeanFieldELBO(**kwargs)
    return JitMeanFieldELBO(fallback=jit == "auto", **kwargs)

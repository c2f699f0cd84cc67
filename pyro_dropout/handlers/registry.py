"""Registry of pre-activation samplers, keyed by estimator and weight distribution family."""

from collections.abc import Callable

import torch

__all__ = ["ESTIMATORS", "register_local_reparameterization", "lookup_rule"]

#: The per-example estimators a rule can implement (see ``docs/local-reparameterization.md``):
#: ``"lrt"`` samples each output element from its Gaussian marginal (exact jointly over one
#: example's units for Linear layers, per position for convolutions), ``"flipout"`` perturbs
#: one shared weight draw with per-example random signs (Wen et al. 2018; exact jointly for
#: symmetric perturbations), ``"per_example"`` draws one weight per example (exact for any
#: family, N times the weight's memory).
ESTIMATORS = ("lrt", "flipout", "per_example")

#: ``rule(fn, x, spec) -> pre-activation`` by (estimator, distribution class).
Rule = Callable[..., torch.Tensor]
_RULES: dict[tuple[str, type], Rule] = {}


def register_local_reparameterization(
    family: type, estimator: str = "lrt"
) -> Callable[[Rule], Rule]:
    """Register a pre-activation sampler for a weight distribution family.

    The decorated function is called as ``rule(fn, x, spec)`` with the guide distribution
    ``fn`` of the weight (``Independent`` wrappers removed), the layer input ``x`` and the
    layer's :class:`~pyro_dropout.nn.functional.LinearSpec` / ``ConvSpec``; it returns one
    sample of ``spec(x, W)`` (without bias) for ``W ~ fn``, drawn independently per example,
    or a :class:`~pyro_dropout.handlers.lrt_rules.GaussianPreactivation` (mean and variance,
    or mean and standard deviation).
    Dispatch follows the class hierarchy, like :func:`torch.distributions.kl.register_kl`.
    An ``"lrt"`` rule that is exact jointly over a convolution's positions may set the attribute
    ``exact_for_conv = True``; ``estimator="auto"`` then uses it for convolutions too (as for
    :class:`~pyro_dropout.ConcreteMaskedNormal`); one exact jointly over the tokens of a
    Linear layer's input ``(B, T..., d)`` (``spec.tokens`` > 0: its draws shared over those
    dims) may set ``exact_for_tokens = True``.

    Example::

        @register_local_reparameterization(MyFamily)
        def _lrt_my_family(fn, x, spec):
            return spec(x, fn.loc)   # a deterministic family
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")

    def decorator(rule):
        _RULES[(estimator, family)] = rule
        return rule

    return decorator


def lookup_rule(fn: object, estimator: str = "lrt") -> Rule | None:
    """The rule registered for ``estimator`` and the most specific class of ``fn``, or None."""
    for cls in type(fn).__mro__:
        rule = _RULES.get((estimator, cls))
        if rule is not None:
            return rule
    return None

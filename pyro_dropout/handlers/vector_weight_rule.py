"""Local reparameterisation of a :class:`~pyro_dropout.distributions.vector_weight.VectorWeight`
(a weight vector read as a one-output layer): the layer family's own rule on that layer."""

from ..distributions.vector_weight import VectorWeight
from ..nn.functional import LinearSpec
from .lrt_rules import GaussianPreactivation
from .registry import lookup_rule, register_local_reparameterization

__all__ = []

#: ``x · w`` is ``x Wᵀ`` for the one-output layer ``W = w[None, :]``.
_ONE_OUTPUT = LinearSpec()


@register_local_reparameterization(VectorWeight)
def _lrt_vector_weight(fn, x, spec):
    layer = fn.layer
    if spec.tokens:
        # One weight per example serves its tokens: the layer family's rule that is exact
        # there (as ``estimator="auto"`` picks for a Linear layer on tokens).
        lrt = lookup_rule(layer, "lrt")
        rule = lrt if getattr(lrt, "exact_for_tokens", False) else None
        rule = rule or lookup_rule(layer, "flipout") or lookup_rule(layer, "per_example")
        out = rule(layer, x, LinearSpec(tokens=spec.tokens))
    else:
        rule = lookup_rule(layer, "lrt") or lookup_rule(layer, "per_example")
        out = rule(layer, x, _ONE_OUTPUT)
    if isinstance(out, GaussianPreactivation):
        return GaussianPreactivation(*(None if t is None else t.squeeze(-1) for t in out))
    return out.squeeze(-1)


#: Picks the layer family's rule that is exact on tokens (above).
_lrt_vector_weight.exact_for_tokens = True  # type: ignore[attr-defined]

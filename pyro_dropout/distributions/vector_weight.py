r"""A weight vector as a one-output layer, for the families whose structure lives on a layer.

The dropout families are defined on a layer's ``(out, in)`` weight: the mask is shared along
the output dimension (one mask value per input unit). A weight *vector* ``w`` of shape
``(in,)`` (``logits = x @ w``) has no output dimension; read as the one-output layer
``W = w[None, :]`` of shape ``(1, in)``, it gets the family exactly as a Linear layer with one
output would: one mask value per input, :math:`w = z \odot m + σ ε`.
:class:`VectorWeight` is that reading: a distribution over ``batch + (in,)`` whose draws,
densities, moments and KL are those of the layer distribution over ``batch + (1, in)``.
"""

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Independent, Normal, constraints, kl_divergence, register_kl

__all__ = ["VectorWeight", "kl_vector_weight_normal"]


class VectorWeight(TorchDistribution):
    """A weight vector ``batch + (in,)`` distributed as the one-output layer ``layer``.

    :param layer: a distribution over ``batch + (1, in)`` with two event dims (e.g.
        ``BernoulliMaskedNormal(loc[..., None, :], scale, rate, event_dim=2)``).
    """

    arg_constraints: dict[str, constraints.Constraint] = {}

    def __init__(self, layer, validate_args=None):
        if len(layer.event_shape) != 2 or layer.event_shape[0] != 1:
            raise ValueError(
                "VectorWeight: layer must be a distribution over a one-output layer, event "
                f"shape (1, in); got event shape {tuple(layer.event_shape)}"
            )
        self.layer = layer
        super().__init__(layer.batch_shape, layer.event_shape[1:], validate_args=validate_args)

    @property
    def has_rsample(self):
        return self.layer.has_rsample

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.independent(constraints.real, 1)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(VectorWeight, _instance)
        new.layer = self.layer.expand(batch_shape)
        super(VectorWeight, new).__init__(
            new.layer.batch_shape, self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.layer.mean.squeeze(-2)

    @property
    def mode(self):
        return self.layer.mode.squeeze(-2)

    @property
    def variance(self):
        return self.layer.variance.squeeze(-2)

    def rsample(self, sample_shape=torch.Size()):
        return self.layer.rsample(sample_shape).squeeze(-2)

    def sample(self, sample_shape=torch.Size()):
        return self.layer.sample(sample_shape).squeeze(-2)

    def log_prob(self, value):
        return self.layer.log_prob(value.unsqueeze(-2))


def _lift_prior(p):
    """A Normal prior over ``batch + (in,)`` as one over ``batch + (1, in)``."""
    base, ndims = p, 0
    while isinstance(base, Independent):
        ndims += base.reinterpreted_batch_ndims
        base = base.base_dist
    if not isinstance(base, Normal) or ndims + len(base.event_shape) != 1:
        raise NotImplementedError
    return dist.Normal(base.loc.unsqueeze(-2), base.scale.unsqueeze(-2)).to_event(2)


def kl_vector_weight_normal(q, p):
    """``KL(q ‖ p)`` for a :class:`VectorWeight` and a Normal prior over the vector: the
    layer family's KL against the prior read as a one-output layer (raises
    ``NotImplementedError``, so Pyro falls back to Monte Carlo, where the family has none)."""
    return kl_divergence(q.layer, _lift_prior(p))


@register_kl(VectorWeight, Normal)
def _kl_vector_weight_normal(q, p):
    return kl_vector_weight_normal(q, p)


@register_kl(VectorWeight, Independent)
def _kl_vector_weight_independent(q, p):
    return kl_vector_weight_normal(q, p)

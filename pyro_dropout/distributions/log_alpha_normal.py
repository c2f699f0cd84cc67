r"""A Normal parameterised by its mean and dropout log-odds, for variational dropout."""

import pyro.distributions as dist
import torch

__all__ = ["LogAlphaNormal"]


class LogAlphaNormal(dist.Normal):
    r""":math:`\mathcal N(θ, α θ^2)` given θ and :math:`\log α` (Kingma et al. 2015's Gaussian
    dropout posterior): a :class:`pyro.distributions.Normal` whose variance is
    :math:`(θ^2 + \epsilon)\, α` (:math:`\epsilon` = the dtype's tiny, so σ > 0 at θ = 0) and which
    keeps ``log_alpha``.

    Why a subclass: the variational-dropout KL is a function of log α and local
    reparameterisation needs the variance; from a plain ``Normal(θ, σ)`` both would be recomputed
    through ``log σ``, ``log θ²`` and a square of a square root (about eight extra passes over
    every weight per step). :func:`~pyro_dropout.distributions.kl_normal_log_uniform` uses
    ``log_alpha`` directly and the local-reparameterisation rule uses :attr:`variance`; everything
    else sees an ordinary Normal with ``scale = sqrt(variance)``.

    The variance is computed as :math:`\exp(\log α + \log(θ^2 + \epsilon))`, not as
    :math:`(θ^2 + \epsilon) \cdot \exp(\log α)`: at θ = 0 variational dropout's
    :math:`\log α = \log σ^2 - \log \epsilon` exceeds 88.7 in float32 for :math:`σ^2 \ge 5`
    (``log tiny`` = −87.3), so ``exp(log α)`` overflows to ``inf`` and the variance and the draw
    with it, although :math:`σ^2` itself is finite. In log space the sum is :math:`\log σ^2`.

    :param loc: θ. :param log_alpha: log α, broadcastable with ``loc``.
    """

    def __init__(self, loc, log_alpha, validate_args=None):
        loc, log_alpha = torch.broadcast_tensors(loc, log_alpha)
        variance = torch.exp(log_alpha + torch.log(loc * loc + torch.finfo(loc.dtype).tiny))
        super().__init__(loc, variance.sqrt(), validate_args=validate_args)
        self.log_alpha = log_alpha
        self._variance = variance

    @property
    def variance(self):
        return self._variance

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LogAlphaNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        for name in ("loc", "scale", "log_alpha", "_variance"):
            setattr(new, name, getattr(self, name).expand(batch_shape))
        super(torch.distributions.Normal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

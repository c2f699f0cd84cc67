"""Bayes by Backprop: a mean-field Gaussian guide."""

from collections.abc import Callable
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from .._checks import is_positive
from .base import AutoWeightGuide
from .init import init_to_fan_in

__all__ = ["AutoMeanField"]


class AutoMeanField(AutoWeightGuide):
    r"""Mean-field Gaussian guide :math:`q(w) = \mathcal N(\mu, \mathrm{softplus}(\rho)^2)` per
    weight (Blundell et al., *Weight uncertainty in neural networks*, ICML 2015).

    The Normal is emitted at each weight site, so with a Normal prior ``TraceMeanField_ELBO``
    uses torch's closed-form ``KL(Normal ‖ Normal)``, and with
    :class:`~pyro_dropout.ImproperLogUniform` the registered VD approximation.

    :param float init_scale: initial posterior standard deviation of every weight.
    :param str name: prefix of the parameters in Pyro's param store (default: the class name,
        the same in every process; see the docs page *Saving and loading*).

    Example::

        model = BayesianMLP(8, 1, hidden=(50,), tau=10.0)
        guide = AutoMeanField(model, init_scale=1e-2)
        fit(model, guide, x, y, num_epochs=100, batch_size=128)
    """

    family = "mean_field"

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        init_scale: float = 0.01,
        init_loc_fn: Callable[[dict], torch.Tensor] = init_to_fan_in,
        create_plates: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if not is_positive(init_scale):
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.init_scale = float(init_scale)
        super().__init__(model, init_loc_fn=init_loc_fn, create_plates=create_plates, name=name)

    @property
    def config(self) -> dict[str, Any]:
        return {"init_scale": self.init_scale}

    def _init_real_site(self, name, site, init_mean):
        n = init_mean.dim()
        self._set("locs", name, PyroParam(init_mean.clone(), constraints.real, n))
        scale = torch.full_like(init_mean, self.init_scale)
        self._set("scales", name, PyroParam(scale, constraints.softplus_positive, n))

    def _real_site_dist(self, name, site):
        loc, scale = self._get("locs", name), self._get("scales", name)
        return dist.Normal(loc, scale).to_event(self._event_dims[name])

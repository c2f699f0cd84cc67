r"""The KL of the mean-field and MC-dropout guides against the UCI model's priors in closed form
(the VD and Concrete KLs are in :mod:`.gradients`, with their derivatives)."""

from __future__ import annotations

import torch
from torch.distributions import Independent, Normal, kl_divergence

from pyro_dropout._broadcast import unexpand
from pyro_dropout.distributions import BernoulliMaskedNormal
from pyro_dropout.guides import AutoDropout

from .support import SITES


def dropout_rates(guide):
    """The drop rates an AutoDropout guide's weight sites use (fixed when its sites were
    set up), ``()`` for other guides."""
    rates = getattr(guide, "_rates", {})
    return tuple(rates[name] for name in (SITES[0], SITES[2]) if name in rates)


def zero_mean_normal_prior(site, why):
    """The site's prior as a :class:`~torch.distributions.Normal`; ``ValueError`` naming
    ``why`` it must be one when it is not zero-mean Normal."""
    prior = site["fn"]
    prior = prior.base_dist if isinstance(prior, Independent) else prior
    if not isinstance(prior, Normal) or bool((unexpand(prior.loc) != 0).any()):
        raise ValueError(f"{why} needs zero-mean Normal priors ({site['name']})")
    return prior


class ClosedFormKL:
    r"""Σ over the four sites of KL(q ‖ p) in a few operations per site: the guide's KLs
    (``pyro_dropout.distributions.kl``) against the model's zero-mean Normal priors are

    * mean-field: :math:`\sum c\,(σ^2 + μ^2) - \tfrac12 \sum \log σ^2 + C`,
      :math:`c = 1 / (2 s^2)`;
    * MC dropout (σ and p fixed): :math:`\sum c\,μ^2 + C` with :math:`c = (1 - p) / (2 s^2)`
      for the weights (Gal & Ghahramani's approximation) and :math:`1 / (2 s^2)` for the
      biases,

    with :math:`s` the prior scale. Why not ``kl_divergence`` on the sites' distributions each
    step: building them and the general KL code took 1.0 ms of a 3.7 ms final-phase step (20
    members). The constant :math:`C` is the library's KL minus the variable part, computed
    once from the library's own ``kl_divergence`` at the parameters of the first call."""

    def __init__(self, guide):
        sites = guide.prototype_trace.nodes
        self._made_for = (guide.prototype_trace, dropout_rates(guide))
        self.dropout = isinstance(guide, AutoDropout)
        self.coef, const = [], 0.0
        with torch.no_grad():
            for name in SITES:
                q = guide._site_dist(name, sites[name])
                prior = zero_mean_normal_prior(sites[name], "the fused KL")
                coef = 0.5 / unexpand(prior.scale) ** 2
                if isinstance(q, BernoulliMaskedNormal):
                    coef = coef * (1 - unexpand(q.dropout_rate))
                self.coef.append(coef)
                loc = guide._get("locs", name)
                if self.dropout:
                    variable = (coef * loc**2).sum()
                else:
                    var = guide._get("scales", name) ** 2
                    variable = (coef * (var + loc**2)).sum() - 0.5 * var.log().sum()
                const += float(kl_divergence(q, sites[name]["fn"]).sum() - variable)
        self.const = const

    @classmethod
    def of(cls, guide):
        """The guide's plan, made again when its sites or drop rates changed."""
        plan = getattr(guide, "_fused_kl", None)
        if plan is None or not plan.valid_for(guide):
            plan = guide._fused_kl = cls(guide)
        return plan

    def valid_for(self, guide):
        """Made for this guide's sites and drop rates (a new prototype or new rates: no)."""
        trace, rates = self._made_for
        now = dropout_rates(guide)
        same = len(rates) == len(now) and all(a is b for a, b in zip(rates, now, strict=True))
        return trace is guide.prototype_trace and same

    def __call__(self, locs, variances=None):
        if self.dropout:
            terms = [(c * loc * loc).sum() for c, loc in zip(self.coef, locs, strict=True)]
        else:
            terms = [
                (c * (v + loc * loc)).sum() - 0.5 * v.log().sum()
                for c, loc, v in zip(self.coef, locs, variances, strict=True)
            ]
        return sum(terms) + self.const

"""``TraceMeanField_ELBO`` that computes log densities only where the ELBO uses them.

Why our own: Pyro's ``TraceMeanField_ELBO`` (via ``get_importance_trace``) evaluates
``log_prob`` of every model site and the score parts of every guide site before it looks for
an analytic KL, and then discards them wherever the KL is analytic. For a Bayesian network
that is two extra passes over every weight (prior ``log_prob`` and guide ``log_prob``; for
:class:`~pyro_dropout.BernoulliMaskedNormal` a mixture ``logsumexp``), which measured as the
largest cost of a training step after the matrix products (see ``docs/benchmarks/speed.md``).
This subclass computes each analytic KL once, evaluates log densities only for observed sites
and for latent sites without an analytic KL (Monte-Carlo fallback, exactly as Pyro does), and
returns the same loss and gradients as ``TraceMeanField_ELBO``.
"""

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from pyro import poutine
from pyro.distributions.util import is_identically_zero, scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.util import check_fully_reparametrized, is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_model_guide_match, check_site_shape, warn_if_nan
from torch.distributions import kl_divergence

from ..handlers.lrt_messenger import _user_stacklevel

__all__ = ["MeanFieldELBO"]


def _check_mean_field_requirement(model_trace, guide_trace):
    """Warn where the guide's sample sites do not come in the model's order (sufficient, not
    necessary, for a mean-field guide). Pyro's ``TraceMeanField_ELBO`` check, as written there
    (Apache 2.0): its function is private (``pyro.infer.trace_mean_field_elbo``), so it is not
    imported."""
    model_sites = [
        name
        for name, site in model_trace.nodes.items()
        if site["type"] == "sample" and name in guide_trace.nodes
    ]
    guide_sites = [
        name
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample" and name in model_trace.nodes
    ]
    if model_sites != guide_sites:
        warnings.warn(
            "Failed to verify mean field restriction on the guide. To eliminate this warning, "
            "ensure model and guide sites occur in the same order.\nModel sites:\n  "
            + "\n  ".join(model_sites)
            + "\nGuide sites:\n  "
            + "\n  ".join(guide_sites),
            stacklevel=_user_stacklevel(sys._getframe()),  # the user's fit or SVI.step line
        )


def _analytic_kl(guide_site, model_site):
    try:
        kl = kl_divergence(guide_site["fn"], model_site["fn"])
    except NotImplementedError:
        return None
    return scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])


def _score_parts(trace, name, site):
    value = site["fn"].score_parts(site["value"], *site["args"], **site["kwargs"])
    site["unscaled_log_prob"] = value.log_prob
    value = value.scale_and_mask(site["scale"], site["mask"])
    site["score_parts"] = value
    site["log_prob"] = value.log_prob
    site["log_prob_sum"] = value.log_prob.sum()


class MeanFieldELBO(TraceMeanField_ELBO):
    """Drop-in replacement for :class:`pyro.infer.TraceMeanField_ELBO` (same estimator, same
    arguments) that skips the log densities an analytic KL makes unnecessary.

    Example::

        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), MeanFieldELBO())
    """

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs
        )
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)

        needs_log_prob = set()
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                needs_log_prob.add(name)
                continue
            guide_site = guide_trace.nodes[name]
            kl = _analytic_kl(guide_site, site)
            if kl is None:
                needs_log_prob.add(name)
                _score_parts(guide_trace, name, guide_site)
            else:
                guide_site["kl"] = kl
        for name, site in guide_trace.nodes.items():  # auxiliary guide sites
            if site["type"] == "sample" and name not in model_trace.nodes:
                _score_parts(guide_trace, name, site)
        model_trace.compute_log_prob(lambda name, site: name in needs_log_prob)

        if is_validation_enabled():
            for trace in (model_trace, guide_trace):
                for site in trace.nodes.values():
                    if site["type"] == "sample" and "log_prob" in site:
                        check_site_shape(site, self.max_plate_nesting)
            _check_mean_field_requirement(model_trace, guide_trace)
        return model_trace, guide_trace

    def differentiable_loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """The negative ELBO estimate as a differentiable tensor (the value of Pyro's
        ``TraceMeanField_ELBO.differentiable_loss``). Pyro's version returns
        ``loss + (surrogate - surrogate.item())``: a host sync per step, and in a captured loss the
        ``item()`` is a constant that changes with every capture (so two captures of one path
        would not compare equal). Every site here is reparameterised, so the
        surrogate is the loss itself."""
        loss: float | torch.Tensor = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            data, kl = self._elbo_terms_particle(model_trace, guide_trace)
            loss = loss + (kl - data) / self.num_particles
        loss = torch.as_tensor(loss)
        warn_if_nan(loss, "loss")  # (inside a capture, its check is not replayed)
        return loss

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        data, kl = self._elbo_terms_particle(model_trace, guide_trace)
        elbo = data - kl
        loss = -torch_item(elbo)
        warn_if_nan(loss, "loss")
        return loss, -elbo

    def _elbo_terms_particle(self, model_trace, guide_trace):
        r"""The two terms of one particle's ELBO estimate, ``ELBO = data - kl``:
        ``data = Σ_obs scale · log p(y | ·)`` (the observed sites, scaled to the full data) and
        ``kl = Σ_latent KL(q ‖ p)`` (analytic where registered; else the Monte-Carlo term
        ``log q - log p`` through the guide's entropy, as in Pyro)."""
        data = 0.0
        kl_total = 0.0
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                data = data + model_site["log_prob_sum"]
                continue
            guide_site = guide_trace.nodes[name]
            kl = guide_site.get("kl")
            if is_validation_enabled():
                if kl is None:
                    check_fully_reparametrized(guide_site)
                elif not guide_site["fn"].has_rsample:  # no score parts here to inspect
                    raise NotImplementedError(
                        "All distributions in the guide must be fully reparameterized."
                    )
            if kl is None:
                entropy = guide_site["score_parts"].entropy_term
                kl_total = kl_total - (model_site["log_prob_sum"] - entropy.sum())
            elif torch.is_tensor(kl):
                assert kl.shape == guide_site["fn"].batch_shape, (name, kl.shape)
                kl_total = kl_total + kl.sum()
            else:
                kl_total = kl_total + kl * torch.Size(guide_site["fn"].batch_shape).numel()
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                assert guide_site["infer"].get("is_auxiliary")
                entropy = guide_site["score_parts"].entropy_term
                if not is_identically_zero(entropy):
                    kl_total = kl_total + entropy.sum()
        return data, kl_total

    def loss_terms(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""``(loss, data, kl)`` as differentiable tensors, each averaged over the particles:
        ``loss = kl - data`` is :meth:`differentiable_loss` (the negative ELBO estimate), ``data``
        the expected log-likelihood term on the full-data scale, ``kl`` the KL term. For
        logging the two parts of the loss without a second pass (e.g.
        :class:`pyro_dropout.lightning.BayesianModule`)."""
        data: float | torch.Tensor = 0.0
        kl: float | torch.Tensor = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            d, k = self._elbo_terms_particle(model_trace, guide_trace)
            data = data + d / self.num_particles
            kl = kl + k / self.num_particles
        data, kl = (torch.as_tensor(t) for t in (data, kl))
        loss = kl - data
        warn_if_nan(torch_item(loss), "loss")
        return loss, data, kl

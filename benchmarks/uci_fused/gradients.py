r"""The fused loss and its gradients written out by hand (no autograd graph)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributions import kl_divergence, transform_to

from pyro_dropout._broadcast import unexpand
from pyro_dropout.distributions import kl as _kl
from pyro_dropout.guides import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
)
from pyro_dropout.guides.base import _deep_getattr

from .closed_form_kl import ClosedFormKL, zero_mean_normal_prior
from .inputs import concrete_inputs, dropout_inputs, gaussian_inputs
from .likelihood import likelihood_gradients, scaled_log_likelihood
from .networks import ConcreteMLP, DropoutMLP, GaussianMLP, StepContext
from .support import SITES

_WEIGHTS, _BIASES = (0, 2), (1, 3)  # indices into SITES


class Unconstrained:
    """One parameter as Pyro's store holds it: the unconstrained tensor (what Adam steps) and
    its transform to the constrained value, with the derivative of that transform."""

    def __init__(self, module, dotted):
        path, _, leaf = dotted.rpartition(".")
        owner = _deep_getattr(module, path) if path else module
        self.tensor = getattr(owner, leaf + "_unconstrained")
        self.transform = transform_to(owner._pyro_params[leaf][0])
        self.identity = self.transform == transform_to(torch.distributions.constraints.real)

    def value(self):
        return self.tensor if self.identity else self.transform(self.tensor)

    def chain(self, grad, value):
        """d loss / d unconstrained, given d loss / d value (an element-wise transform)."""
        if self.identity:
            return grad
        return grad * self.transform.log_abs_det_jacobian(self.tensor, value).exp()


class ManualGradients:
    """The loss of :func:`~.loss.fused_loss` and its gradients written out by hand: the
    kernels' backward for the network, the KL's derivatives in closed form (mean-field and MC
    dropout: :math:`∂/∂μ = 2cμ`, and for mean-field :math:`∂/∂σ^2 = c - 1/(2σ^2)`; VD and
    Concrete dropout in :meth:`_vd` and :meth:`_init_concrete`), the likelihood's for ``f``
    and the learned noise SDs (:func:`~.likelihood.likelihood_gradients`), chained through
    each parameter's transform.

    Why: without a graph, a 20-member final step skips autograd's and the transforms'
    per-operation overhead (the step is bound by it, not by arithmetic). Checked against
    autograd of :func:`~.loss.fused_loss` given the same noise
    (``tests/bench/test_uci_fused.py``). Raises ``ValueError`` for priors it does not
    cover (:class:`~.svi.FusedSVI` then takes autograd's gradients)."""

    def __init__(self, model, guide):
        self.model, self.guide = model, guide
        self.buffers = {}  # the step's large tensors, kept across steps (see networks.scratch)
        self.dropout = isinstance(guide, AutoDropout)
        self.vd = isinstance(guide, AutoVariationalDropout)
        self.concrete = isinstance(guide, AutoConcreteDropout)
        self.hidden = model.layers[0].out_features
        self.locs = [Unconstrained(guide.locs, name) for name in SITES]
        self.noise = None if model.learned_sd is None else Unconstrained(model, "learned_sd")
        if self.concrete:
            self._init_concrete(guide)
        elif self.vd:  # weights: θ and log σ²; biases: Normal(μ, softplus(ρ)) under Normal priors
            self.log_var = {i: Unconstrained(guide.log_sigma2, SITES[i]) for i in _WEIGHTS}
            self.scales = {i: Unconstrained(guide.scales, SITES[i]) for i in _BIASES}
            sites = guide.prototype_trace.nodes
            why = "the hand-written VD gradients"
            self.bias_prior = {
                i: unexpand(zero_mean_normal_prior(sites[SITES[i]], why).scale).detach()
                for i in _BIASES
            }
        else:  # MC dropout's slab scales are fixed: no parameter
            self.scales = None if self.dropout else [Unconstrained(guide.scales, n) for n in SITES]

    @staticmethod
    def applies(model, guide):
        if type(guide) is AutoConcreteDropout:
            return guide.rate_per == "layer"
        if type(guide) is AutoVariationalDropout:
            # written for one log σ² per weight and Molchanov's KL
            return guide.alpha == "weight" and _kl._approximation == "molchanov"
        return type(guide) in (AutoMeanField, AutoDropout)

    def __call__(self, x, y, num_data, rng):
        """``(loss, {unconstrained tensor: gradient})``."""
        with torch.no_grad():
            locs = [h.tensor for h in self.locs]
            if self.vd:
                return self._vd(x, y, num_data, locs, rng)
            if self.concrete:
                return self._concrete(x, y, num_data, locs, rng)
            plan = ClosedFormKL.of(self.guide)
            if self.dropout:
                return self._dropout(x, y, num_data, locs, rng, plan)
            return self._meanfield(x, y, num_data, locs, rng, plan)

    def _likelihood(self, f, y, num_data, grads):
        """The negative scaled log-likelihood and d/df; d/d noise SD into ``grads``."""
        log_lik, z, sd = scaled_log_likelihood(self.model, f, y, num_data)
        g_f, g_sd = likelihood_gradients(z, sd, num_data)
        if self.noise is not None:
            g_sd = torch.where(self.model.learned, g_sd, torch.zeros_like(g_sd))
            grads[self.noise.tensor] = self.noise.chain(g_sd, self.noise.value())
        return -log_lik, g_f

    # Gradients go out in the parameters' own (contiguous) layout: the kernels' first-layer
    # gradients are transposed views, and torch's fused optimisers assume that a gradient is
    # laid out as its parameter (autograd guarantees it; we set .grad).

    def _meanfield(self, x, y, num_data, locs, rng, plan):
        grads, ctx = {}, StepContext(self.buffers)
        sigma = [h.value() for h in self.scales]
        var = [s * s for s in sigma]
        f = GaussianMLP.forward(ctx, *gaussian_inputs(self.model, x, locs, var, rng, ctx))
        nll, g_f = self._likelihood(f, y, num_data, grads)
        g_loc, g_var = _gaussian_backward(ctx, g_f)
        for h, c, loc, g in zip(self.locs, plan.coef, locs, g_loc, strict=True):
            grads[h.tensor] = (2 * c * loc + g.reshape(loc.shape)).contiguous()
        for h, c, s, v, g in zip(self.scales, plan.coef, sigma, var, g_var, strict=True):
            g_v = (c - 0.5 / v) + g.reshape(v.shape)
            grads[h.tensor] = h.chain(g_v * 2 * s, s).contiguous()
        return (plan(locs, var) + nll).item(), grads

    def _dropout(self, x, y, num_data, locs, rng, plan):
        grads, ctx = {}, StepContext(self.buffers)
        inputs = dropout_inputs(self.model, self.guide, x, rng, locs, ctx)
        f = DropoutMLP.forward(ctx, *inputs)
        nll, g_f = self._likelihood(f, y, num_data, grads)
        out = DropoutMLP.backward(ctx, g_f)
        g_net = [out[4].transpose(1, 2), out[5], out[8], out[9]]
        for h, c, loc, g in zip(self.locs, plan.coef, locs, g_net, strict=True):
            grads[h.tensor] = (2 * c * loc + g.reshape(loc.shape)).contiguous()
        return (plan(locs) + nll).item(), grads

    def _vd(self, x, y, num_data, locs, rng):
        r"""Variational dropout: weights :math:`\mathcal N(θ, \exp(\log σ^2))` with
        Molchanov's KL in :math:`\log α = \operatorname{clip}(\log σ^2 - \log(θ^2 + ε))`
        (``pyro_dropout.distributions.kl``), biases Normal with Normal priors."""
        grads, kl, var, sigma = {}, 0.0, [None] * 4, {}
        lo, hi = _kl.LOG_ALPHA_RANGE
        tiny = torch.finfo(x.dtype).tiny
        d_var, d_loc = {}, {}  # d KL / d log σ² for the weights, d KL / d σ² for the biases
        for i, h in self.log_var.items():
            log_var, loc = h.tensor, locs[i]
            var[i] = log_var.exp()
            raw = log_var - torch.log(loc * loc + tiny)
            log_alpha = raw.clamp(lo, hi)
            sig = torch.sigmoid(_kl.K2 + _kl.K3 * log_alpha)
            kl = kl - (_kl.K1 * sig - 0.5 * F.softplus(-log_alpha) - _kl.K1).sum()
            # d KL / d log α, zero where the clip holds (hardtanh's gradient)
            g = -(_kl.K1 * _kl.K3 * sig * (1 - sig) + 0.5 * torch.sigmoid(-log_alpha))
            g = torch.where((raw > lo) & (raw < hi), g, torch.zeros_like(g))
            d_var[i] = g
            d_loc[i] = g * (-2 * loc / (loc * loc + tiny))
        for i, h in self.scales.items():
            s, loc, s0 = h.value(), locs[i], self.bias_prior[i]
            sigma[i], var[i] = s, s * s
            c = 0.5 / (s0 * s0)
            kl = kl + ((var[i] + loc * loc) * c - torch.log(s)).sum()
            kl = kl + ((torch.log(s0) - 0.5) * torch.ones_like(loc)).sum()
            d_loc[i] = 2 * c * loc
            d_var[i] = c - 0.5 / var[i]
        ctx = StepContext(self.buffers)
        f = GaussianMLP.forward(ctx, *gaussian_inputs(self.model, x, locs, var, rng, ctx))
        nll, g_f = self._likelihood(f, y, num_data, grads)
        g_loc, g_var = _gaussian_backward(ctx, g_f)
        for i, h in enumerate(self.locs):
            grads[h.tensor] = (d_loc[i] + g_loc[i].reshape(locs[i].shape)).contiguous()
        for i, h in self.log_var.items():  # d / d log σ² = σ² d / d σ²
            grads[h.tensor] = (d_var[i] + g_var[i].reshape(var[i].shape) * var[i]).contiguous()
        for i, h in self.scales.items():
            g_v = d_var[i] + g_var[i].reshape(var[i].shape)
            grads[h.tensor] = h.chain(g_v * 2 * sigma[i], sigma[i]).contiguous()
        return (kl + nll).item(), grads

    def _init_concrete(self, guide):
        r"""Concrete dropout's KL per weight site (Gal, Hron & Kendall's, zero-mean prior of
        scale s, K input units): :math:`\frac{\sum m'^2}{2 s^2 (1 - p)} + K (p \log p + (1-p)
        \log(1-p)) + C`; per bias (Normal(μ, σ) with σ fixed): :math:`\sum μ^2 / (2 s^2) + C`.
        The coefficients from the model's priors, the constants C from the library's KL."""
        sites = guide.prototype_trace.nodes
        self.rates = {i: Unconstrained(guide.drop_rates, SITES[i]) for i in _WEIGHTS}
        self.half_precision, self.units, const = {}, {}, 0.0
        with torch.no_grad():
            for i, name in enumerate(SITES):
                prior = zero_mean_normal_prior(sites[name], "the hand-written Concrete gradients")
                hp = self.half_precision[i] = 0.5 / unexpand(prior.scale) ** 2
                loc = guide._get("locs", name)
                if i in self.rates:
                    self.units[i] = loc.shape[-1]
                    variable = self._concrete_kl(i, loc, guide._rate(name))[0]
                else:
                    variable = (hp * loc**2).sum()
                q = guide._site_dist(name, sites[name])
                const += float(kl_divergence(q, sites[name]["fn"]).sum() - variable)
        self.concrete_const = const

    def _concrete_kl(self, i, loc, p):
        """A weight site's KL less its constant, with its derivatives to ``m'`` and to ``p``."""
        hp = self.half_precision[i]
        sq = (hp * loc * loc).sum((-1, -2), keepdim=True)
        entropy = p * torch.log(p) + (1 - p) * torch.log1p(-p)
        kl = (sq / (1 - p)).sum() + (self.units[i] * entropy).sum()
        d_loc = 2 * hp * loc / (1 - p)
        d_rate = sq / (1 - p) ** 2 + self.units[i] * (torch.log(p) - torch.log1p(-p))
        return kl, d_loc, d_rate

    def _concrete(self, x, y, num_data, locs, rng):
        """Concrete dropout: the kernels' backward gives d/d logit p and d/d (1/(1-p)) of each
        layer, chained to p (clamped to [eps, 1 - eps] as the guide does) and to its
        unconstrained parameter with the KL's own d/dp."""
        grads, kl, d_loc, d_rate = {}, self.concrete_const, {}, {}
        eps = torch.finfo(x.dtype).eps
        raw = {i: h.value() for i, h in self.rates.items()}
        rate = {i: r.clamp(eps, 1 - eps) for i, r in raw.items()}
        for i, loc in enumerate(locs):
            if i in rate:
                kl_i, d_loc[i], d_rate[i] = self._concrete_kl(i, loc, rate[i])
            else:
                hp = self.half_precision[i]
                kl_i, d_loc[i] = (hp * loc * loc).sum(), 2 * hp * loc
            kl = kl + kl_i
        ctx = StepContext(self.buffers)
        inputs = concrete_inputs(self.guide, x, locs, [rate[0], rate[2]], self.hidden, rng, ctx)
        f = ConcreteMLP.forward(ctx, *inputs)
        nll, g_f = self._likelihood(f, y, num_data, grads)
        out = ConcreteMLP.backward(ctx, g_f)
        glp, ginv = {0: out[3], 2: out[4]}, {0: out[5], 2: out[6]}
        g_net = [out[7].transpose(1, 2), out[8], out[10], out[11]]
        for i, h in enumerate(self.locs):
            grads[h.tensor] = (d_loc[i] + g_net[i].reshape(locs[i].shape)).contiguous()
        for i, h in self.rates.items():
            p = rate[i]
            g_p = d_rate[i] + (
                glp[i].reshape(p.shape) / (p * (1 - p)) + ginv[i].reshape(p.shape) / (1 - p) ** 2
            )
            g_p = torch.where((raw[i] >= eps) & (raw[i] <= 1 - eps), g_p, torch.zeros_like(g_p))
            grads[h.tensor] = h.chain(g_p, raw[i]).contiguous()
        return (kl + nll).item(), grads


def _gaussian_backward(ctx, g_f):
    """GaussianMLP's backward as the sites' gradients to their means and variances."""
    _, gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v, _, _ = GaussianMLP.backward(ctx, g_f)
    return [gw1m.transpose(1, 2), gb1m, gm2, gb2m], [gw1v.transpose(1, 2), gb1v, gv2, gb2v]

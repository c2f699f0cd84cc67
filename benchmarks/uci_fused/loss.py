"""The fused negative ELBO as a differentiable torch scalar (autograd through the kernels'
Functions): the reference for the hand-written gradients, and the step for guides they do
not cover."""

from __future__ import annotations

from torch.distributions import kl_divergence

from pyro_dropout.guides import AutoConcreteDropout, AutoDropout, AutoVariationalDropout

from .closed_form_kl import ClosedFormKL
from .inputs import RNG, concrete_inputs, dropout_inputs, gaussian_inputs
from .likelihood import scaled_log_likelihood
from .networks import ConcreteMLP, DropoutMLP, GaussianMLP
from .support import SITES, unsupported_reason


def fused_loss(model, guide, x, y, num_data=None, rng="kernel"):
    """The negative ELBO of ``(model, guide)`` on the minibatch ``x`` ``(M, B, D)``, ``y``
    ``(M, B)``, as a differentiable scalar of the guide's (and the model's) parameters.
    Raises ``ValueError`` when :func:`~.support.unsupported_reason` names a reason.

    :param rng: where the random numbers come from: ``"kernel"`` (the default: AutoDropout's
        mask uniforms counter-based inside the kernels, 10x cheaper than torch's CPU
        generator, and the normals by the kernels' ``fill_normal``, 2x) or ``"torch"``
        (``torch.rand`` and ``normal_``, as the LRT rules draw them: the tests' exact check).
        Concrete dropout's relaxed masks always come from torch (their logit and sigmoid are
        vectorised there; the kernels' scalar log and exp took longer than the traced step)."""
    if rng not in RNG:
        raise ValueError(f"rng must be 'kernel' or 'torch', got {rng!r}")
    reason = unsupported_reason(model, guide)
    if reason is not None:
        raise ValueError(f"fused_loss cannot train this model: {reason}")
    if x.device.type != "cpu":
        raise ValueError("fused_loss runs on CPU tensors (numba kernels)")
    if guide.prototype_trace is None:
        guide._setup_prototype(x, y, num_data=num_data)
    locs = [guide._get("locs", name) for name in SITES]
    if isinstance(guide, (AutoVariationalDropout, AutoConcreteDropout)):
        # Their KLs (Molchanov's approximation in log α; Gal, Hron & Kendall's in p) do not fit
        # ClosedFormKL: the sites' distributions and the library's KL, as the ELBO does.
        sites = guide.prototype_trace.nodes
        q = {name: guide._site_dist(name, sites[name]) for name in SITES}
        kl = sum(kl_divergence(q[name], sites[name]["fn"]).sum() for name in SITES)
        if isinstance(guide, AutoConcreteDropout):
            if not guide.relaxed:
                raise ValueError(
                    "the fused Concrete loss draws relaxed masks: train with gradients on"
                )
            hidden = model.layers[0].out_features
            rates = [guide._rate(name) for name in (SITES[0], SITES[2])]
            f = ConcreteMLP.apply(*concrete_inputs(guide, x, locs, rates, hidden, rng))
        else:  # the sites are Gaussian: mean-field's kernels draw f
            locs = [q[name].base_dist.loc for name in SITES]
            var = [q[n].base_dist.variance.expand_as(m) for n, m in zip(SITES, locs, strict=True)]
            f = GaussianMLP.apply(*gaussian_inputs(model, x, locs, var, rng))
    elif isinstance(guide, AutoDropout):
        kl = ClosedFormKL.of(guide)(locs)
        f = DropoutMLP.apply(*dropout_inputs(model, guide, x, rng, locs))
    else:
        var = [guide._get("scales", name) ** 2 for name in SITES]
        kl = ClosedFormKL.of(guide)(locs, var)
        f = GaussianMLP.apply(*gaussian_inputs(model, x, locs, var, rng))
    return kl - scaled_log_likelihood(model, f, y, num_data)[0]

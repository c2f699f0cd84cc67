r"""Local-reparameterisation rules for the built-in families.

Normal (mean-field and variational dropout): :math:`b \sim \mathcal N(\mathrm{op}(x, μ),
\mathrm{op}(x^2, σ^2))`, for Linear and convolution ``op`` alike.

:class:`~pyro_dropout.BernoulliMaskedNormal`: given the mask, :math:`W x = M(z \odot x) +
(σ \odot ε)x`, so a pre-activation is ``op(x ⊙ z, M) + sqrt(op(x², σ²)) · ε`` with a fresh mask
per example on the layer input: exactly standard dropout plus the small slab noise. For
convolutions the mask drops input elements (Gal & Ghahramani's Bayesian CNN); per output
element this has the same mean and variance as the weight-space family (each kernel tap meets
a different input element), only correlations across positions differ.

:class:`~pyro_dropout.ConcreteMaskedNormal` (Concrete dropout): the same, with the family's
keep mask (relaxed while training, hard otherwise) drawn per example on the layer input; its
mask is shared by all weights reading one input channel, so for convolutions the per-example
mask drops whole input channels, and with the slab noise added by Flipout (shared over
positions) the rule is exact jointly over positions and channels. For a grouped convolution the
kernel's input channel ``j`` is read by every group, so one mask value per example and kernel
input channel is tiled over the groups.

Tokens and sets. A Linear layer applied to an input ``(B, T, d)`` (``LinearSpec.tokens > 0``)
uses one weight for the ``T`` tokens of an example, so their outputs are correlated under q.
Drawn per token, the pre-activations would be independent (ten identical tokens, mean-pooled:
a tenth of q's variance). There the rules share what they draw over the token dims, like a
convolution's positions: the dropout families' masks per example (on the input units, or on
the output units of ``x @ w``) with the slab noise added by Flipout (signs per example), both
exact jointly over the tokens and marked ``exact_for_tokens``; Flipout and one weight per
example likewise.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.distributions import Distribution, Independent, Normal

from .._broadcast import broadcast_shape, is_uniform
from ..distributions import BernoulliMaskedNormal, ConcreteMaskedNormal, concrete_keep_mask
from ..nn.functional import ConvSpec, LinearSpec, unexpand
from .registry import register_local_reparameterization

__all__ = ["GaussianPreactivation", "sample_gaussian_preactivation"]

#: Variances are clamped here before the square root (sqrt has an infinite gradient at 0).
VARIANCE_FLOOR = 1e-12


class GaussianPreactivation(NamedTuple):
    """A rule's answer when the pre-activation is Gaussian given the rule's own draws (the
    dropout mask, say): the messenger adds the bias's mean and variance and draws the noise
    once per layer. A rule may give the standard deviation ``sd`` instead of the variance
    (``var`` None) where it has it at fewer operations (see :func:`_with_slab_noise`)."""

    mean: torch.Tensor
    var: torch.Tensor | None
    sd: torch.Tensor | None = None

    def variance(self) -> torch.Tensor:
        """The variance, from ``sd`` where the rule gave that."""
        if self.var is not None:
            return self.var
        assert self.sd is not None
        return self.sd * self.sd


def sample_gaussian_preactivation(mean, var, batch=(), sd=None):
    """``mean + sqrt(max(var, floor)) · ε`` with ε ~ N(0, 1) of the output's shape (or
    ``mean + sd · ε`` where ``sd`` is given instead of ``var``).

    ``batch`` is the shape the output must at least have: the weight distribution's batch
    (its sample dims) laid out against the output. A family whose parameters are equal along
    a sample dim (e.g. expanded by a vectorising plate) gives a mean and variance without it,
    yet every draw needs its own noise."""
    shape = broadcast_shape(mean.shape, (var if sd is None else sd).shape, batch)
    eps = torch.randn(shape, dtype=mean.dtype, device=mean.device)
    if sd is None:
        # The floor as ``threshold`` (var if var > floor, else floor): the same values as
        # ``clamp_min``, and a one-pass backward where clamp_min's takes a comparison and a
        # select.
        sd = F.threshold(var, VARIANCE_FLOOR, VARIANCE_FLOOR).sqrt()
    # One pass over the output (``mean + sd * eps`` takes two), the same values and gradients.
    return torch.addcmul(mean, sd, eps)


#: Inputs of at most this many elements take the norm form of :func:`_with_slab_noise`.
NORM_FORM_MAX = 16384


def _with_slab_noise(mean, x, scale, spec):
    """``mean`` with the slab noise's variance ``op(x², σ²)``. For a Linear layer with one
    shared σ that is ``σ² Σ_i x_i²``, given on small inputs as the SD ``σ ‖x‖``: with a bias
    scale the messenger then takes ``hypot(σ ‖x‖, σ_b)``, three operations where the square,
    sum, scaling, bias variance, floor and square root take six (20 us less a layer at the
    speed benchmark's W1, measured 2026-11-29; on a 128 × 784 input the norm's kernels cost
    20 us more than the operations save, so larger inputs keep the variance). No floor is
    needed here: ``‖x‖``'s gradient at ``x = 0`` is 0 (torch's norm backward); the messenger
    floors σ_b."""
    if is_uniform(scale) and isinstance(spec, LinearSpec) and not spec.vector:
        s = scale.reshape(-1)[0]
        if x.numel() <= NORM_FORM_MAX:
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
            return GaussianPreactivation(mean, None, norm * s)
        return GaussianPreactivation(mean, s**2 * (x * x).sum(-1, keepdim=True))
    return GaussianPreactivation(mean, spec(x * x, scale * scale))


@register_local_reparameterization(Normal)
def _lrt_normal(fn, x, spec):
    return GaussianPreactivation(spec(x, fn.loc), spec(x * x, fn.variance))


def _per_example_shape(shape, spec, features=1):
    """``shape`` (a Linear layer's input or output) with its token dims set to 1, so that a
    mask or noise of that shape is drawn per example and shared over the tokens; ``features``
    trailing dims are kept (the output of a vector weight has none)."""
    tokens = spec.tokens
    if not tokens:
        return shape
    n = len(shape) - features
    return shape[: n - tokens] + (1,) * tokens + shape[n:]


def _input_keep_prob(fn, spec):
    """Keep probability per input unit, aligned with the layer input ``x``."""
    keep = 1.0 - fn.dropout_rate.select(-fn.event_dim, 0)  # drop the (size-1) output dim
    if isinstance(spec, ConvSpec):
        kernel = keep.shape[-spec.ndim :]
        flat = unexpand(keep).reshape(unexpand(keep).shape[: -spec.ndim] + (-1,))
        if kernel.numel() > 1 and flat.shape[-1] > 1 and not (flat == flat[..., :1]).all():
            raise ValueError(
                "local_reparameterization for convolutions drops input elements, so the "
                "dropout_rate must not vary across kernel positions"
            )
        keep = keep[(...,) + (0,) * spec.ndim]
        if spec.groups > 1:  # the kernel sees in_channels / groups channels per group
            keep = keep.repeat((1,) * (keep.dim() - 1) + (spec.groups,))
        keep = keep[(...,) + (None,) * spec.ndim]
    return keep


@register_local_reparameterization(BernoulliMaskedNormal)
def _lrt_bernoulli_masked_normal(fn, x, spec):
    tokens = isinstance(spec, LinearSpec) and spec.tokens
    if isinstance(spec, LinearSpec) and spec.transposed:
        # Weight stored (in, out) and used as ``x @ W``: the mask, shared along the first
        # event dim, zeroes whole output columns, so it multiplies the outputs per example.
        mean = spec(x, fn.loc)
        keep = 1.0 - fn.dropout_rate.select(-fn.event_dim, 0)
        rows = _per_example_shape(mean.shape, spec, spec.feature_dims) if tokens else mean.shape
        shape = broadcast_shape(rows, keep.shape)
        mask = torch.rand(shape, dtype=x.dtype, device=x.device).lt_(keep)
        mean = mean * mask
    else:
        keep = _input_keep_prob(fn, spec)
        shape = broadcast_shape(
            _per_example_shape(x.shape, spec) if tokens else x.shape, keep.shape
        )
        # A float 0/1 mask made in place (``lt_`` keeps the dtype): a bool mask would be
        # converted to x's dtype by every product with it.
        mask = torch.rand(shape, dtype=x.dtype, device=x.device).lt_(keep)
        mean = spec(x * mask, fn.loc)
    if tokens:
        # One weight per example serves its tokens: the slab noise too (Flipout).
        return mean + _flipout_slab(fn, x, spec)
    return _with_slab_noise(mean, x, fn.scale, spec)


#: Exact jointly over the tokens of a Linear layer's input (masks and slab per example).
_lrt_bernoulli_masked_normal.exact_for_tokens = True  # type: ignore[attr-defined]


def _concrete_mask_and_weight(fn, rates, shape):
    """The keep mask of ``shape`` and the weight it multiplies: ``z`` and :math:`M`, or, for
    a family built by :meth:`~pyro_dropout.ConcreteMaskedNormal.from_mean`, ``z / (1 - p)``
    and the mean weight (the same product; :math:`M` itself, the whole weight divided by
    :math:`1 - p`, is never formed: see ``from_mean``)."""
    rate, logit, keep = rates
    mask = concrete_keep_mask(rate, fn.temperature, shape, fn.relaxed, logit)
    if fn.mean_weight is None:
        return mask, fn.loc
    return mask / keep, fn.mean_weight


def _concrete_rates(fn, spec, x):
    """``(p, logit p or None, 1 - p)`` on the family's compact rates without their output dim.
    ``1 - p`` is computed as the KL computes it (on the compact rates, then the dim selected),
    so that a compiled loss computes it once; the logit is the family's own where it was built
    from one (:class:`~pyro_dropout.AutoConcreteDropout`'s), saving a ``logit`` per layer."""
    rate, logit = fn._compact_rate, fn._compact_logit
    keep = 1 - rate
    if isinstance(spec, LinearSpec) and not spec.transposed and rate.dim() == 2 and x.dim() > 1:
        # A Linear weight without batch dims on rows of inputs: the rates' size-1 output dim
        # stands where the rows' last dim does and broadcasts against it as it is (three views
        # a layer and step fewer). (A single input vector keeps the selected rates: its output
        # must stay a vector.)
        return rate, logit, keep
    dim = -fn.event_dim
    return (
        rate.select(dim, 0),
        None if logit is None else logit.select(dim, 0),
        keep.select(dim, 0),
    )


@register_local_reparameterization(ConcreteMaskedNormal)
def _lrt_concrete_masked_normal(fn, x, spec):
    # The rates' shape is batch + (in,) + (1,) * kernel dims: every draw of the batch needs its
    # own mask even where the rates are equal (one per layer), so masks take that shape, while
    # the arithmetic runs on the rates without their broadcast dims.
    full = fn.dropout_rate.shape
    rate_shape = full[: len(full) - fn.event_dim] + full[len(full) - fn.event_dim + 1 :]
    rates = _concrete_rates(fn, spec, x)
    rate, logit, keep = rates
    if isinstance(spec, LinearSpec) and spec.transposed:
        # Weight stored (in, out), used as x @ W: the mask zeroes output columns (see the
        # Bernoulli rule above).
        weight = fn.loc if fn.mean_weight is None else fn.mean_weight
        mean = spec(x, weight)
        rows = _per_example_shape(mean.shape, spec, spec.feature_dims)
        mask, _ = _concrete_mask_and_weight(fn, rates, broadcast_shape(rows, rate_shape))
        if spec.tokens:
            return mean * mask + _flipout_slab(fn, x, spec)
        return _with_slab_noise(mean * mask, x, fn.scale, spec)
    # One mask value per example and input unit (shared over an example's tokens); for a
    # convolution per example and channel (the rate's kernel dims are 1, so the mask
    # broadcasts over positions).
    if isinstance(spec, LinearSpec):
        rows = _per_example_shape(x.shape, spec)
    else:
        # A grouped kernel (out, C/g, *k) has one mask per *kernel* input channel, and q shares
        # it across the g groups: channel j of every group reads the same z_j (a depthwise
        # kernel, C/g = 1, has one mask for all channels). So draw C/g values per example and
        # tile them over the groups; drawing C independent ones would decorrelate the groups.
        lead = x.shape[: x.dim() - spec.ndim - 1]
        rows = lead + (x.shape[-spec.ndim - 1] // spec.groups,) + (1,) * spec.ndim
    shape = broadcast_shape(rows, rate_shape)
    unit_dim = -1 if isinstance(spec, LinearSpec) else -1 - spec.ndim
    if (
        fn.mean_weight is not None
        and rate.shape[unit_dim] == 1
        and isinstance(spec, LinearSpec)
        and math.prod(x.shape[:-1]) * (x.shape[-1] - 2 * fn.mean_weight.shape[-2]) > 16384
    ):
        # One rate for all input units (one per layer): (x ⊙ z / (1 - p)) W = ((x ⊙ z) W) /
        # (1 - p), so the factor may scale the output rather than the mask. Where the mask is
        # small the mask takes it, so that the bias joins the product in one kernel (a division
        # of the output stands between them: two operations, not one); the output takes it
        # where that divides 16,384 elements fewer (about the cost of an operation, measured:
        # 1.4 us a call, 0.1 ns an element on CPU), e.g. a layer of 400 inputs and 10 outputs
        # on 128 rows.
        mask = concrete_keep_mask(rate, fn.temperature, shape, fn.relaxed, logit)
        weight, out_scale = fn.mean_weight, keep
    else:
        (mask, weight), out_scale = _concrete_mask_and_weight(fn, rates, shape), None
    if isinstance(spec, ConvSpec) and spec.groups > 1:
        mask = mask.repeat((1,) * (mask.dim() - spec.ndim - 1) + (spec.groups,) + (1,) * spec.ndim)
    mean = spec(x * mask, weight)
    if out_scale is not None:
        mean = mean / out_scale  # (one division: a reciprocal and a product take two)
    if isinstance(spec, LinearSpec) and not spec.tokens:
        return _with_slab_noise(mean, x, fn.scale, spec)
    # A kernel is shared by all positions (a Linear weight by all tokens), so its slab noise
    # σ ⊙ ε must be too: Flipout rather than independent Gaussian noise per position.
    return mean + _flipout_slab(fn, x, spec)


#: Exact jointly over a convolution's positions and a Linear input's tokens: "auto" prefers
#: it to Flipout there.
_lrt_concrete_masked_normal.exact_for_conv = True  # type: ignore[attr-defined]
_lrt_concrete_masked_normal.exact_for_tokens = True  # type: ignore[attr-defined]


# -- Flipout (Wen et al. 2018) ----------------------------------------------------------------


def _signs(shape, like):
    """Independent random ±1 of ``shape``."""
    return torch.rand(shape, dtype=like.dtype, device=like.device).lt_(0.5).mul_(2).sub_(1)


def _per_channel(shape, spec, features=1):
    """``shape`` of an input or output with its spatial dims reduced to 1 (one sign per
    example and channel for a convolution, per example and unit for a Linear layer, shared
    over its token dims; ``features`` as in :func:`_per_example_shape`)."""
    if isinstance(spec, ConvSpec):
        return shape[: len(shape) - spec.ndim] + (1,) * spec.ndim
    return _per_example_shape(shape, spec, features)


def _flipout_slab(fn, x, spec):
    r"""Flipout's perturbation ``r ⊙ op(x ⊙ s, σ ⊙ ε)`` of the slab noise σ ⊙ ε (one ε per
    draw, signs per example and channel): the example sees the weight noise
    :math:`(σ \odot ε) \odot (r s^\top)`, distributed as σ ⊙ ε (ε symmetric, independent of
    the signs and of the masks), the same at all its positions or tokens."""
    delta = fn.scale * torch.randn(fn.batch_shape + fn.event_shape, dtype=x.dtype, device=x.device)
    s = _signs(_per_channel(x.shape, spec), x)
    pert = spec(x * s, delta)
    return _signs(_per_channel(pert.shape, spec, spec.feature_dims), x) * pert


@register_local_reparameterization(Normal, estimator="flipout")
def _flipout_normal(fn, x, spec):
    r"""Flipout: one perturbation :math:`ΔW = σ \odot ε` per weight draw, decorrelated across
    examples by random signs, :math:`b_n = \mathrm{op}(x_n, μ) + r_n \odot \mathrm{op}(x_n
    \odot s_n, ΔW)` with :math:`s_n` per input channel and :math:`r_n` per output channel.
    Example n then sees the weight :math:`μ + ΔW \odot (r_n s_n^\top)`, distributed exactly
    as :math:`q` (ε is symmetric and independent of the signs), applied at every position of a
    convolution: the estimator is exact jointly over positions, unlike per-position LRT."""
    mean = spec(x, fn.loc)
    delta = fn.scale * torch.randn(fn.batch_shape, dtype=x.dtype, device=x.device)
    s = _signs(_per_channel(x.shape, spec), x)
    pert = spec(x * s, delta)
    r = _signs(_per_channel(pert.shape, spec, spec.feature_dims), x)
    return mean + r * pert


# -- one weight draw per example ------------------------------------------------------------


def weight_event_dims(spec):
    """Event dims of the weight a spec applies: 1 (vector), 2 (Linear), 2 + ndim (conv)."""
    if isinstance(spec, ConvSpec):
        return 2 + spec.ndim
    return 1 if spec.vector else 2


@register_local_reparameterization(Distribution, estimator="per_example")
def _per_example(fn, x, spec):
    """One weight draw :math:`W_n \\sim q` per example, applied as one batched matmul or one
    grouped convolution: exact for any family with ``rsample``, independent across examples,
    at ``N`` times the weight's memory."""
    event = weight_event_dims(spec)
    if len(fn.event_shape) < event:
        fn = Independent(fn, event - len(fn.event_shape))
    if isinstance(spec, ConvSpec):
        rows = x.shape[: x.dim() - spec.feature_dims]
    else:  # one draw per example, shared over its tokens
        rows = _per_example_shape(x.shape, spec)[:-1]
    batch = broadcast_shape(rows, fn.batch_shape)
    w = fn.expand(batch).rsample()
    return spec(x, w)

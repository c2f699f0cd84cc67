"""Turning a user's prior specification into a distribution over a whole weight tensor, and
the two hierarchical priors whose scale is fitted to the data: :class:`LearnedPrior`
(empirical Bayes) and :class:`HyperPrior` (a Gamma hyperprior on the precision)."""

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

import torch
from pyro.distributions import Gamma, Normal, TorchDistribution
from torch.distributions import Distribution

from ..distributions.empirical_bayes import EmpiricalBayesScale

__all__ = ["make_prior", "LearnedPrior", "HyperPrior", "hierarchical_prior"]

_GROUPS = ("layer", "unit")


def _check_per(per):
    if per not in _GROUPS:
        raise ValueError(f"per must be 'layer' or 'unit', got {per!r}")
    return per


def _positive(x, what):
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not x > 0:
        raise ValueError(f"{what} must be a positive number, got {x!r}")
    return float(x)


@dataclass(frozen=True)
class LearnedPrior:
    r"""Weight prior :math:`\mathcal N(0, s^2)` with the scale :math:`s` fitted to the data: a
    point estimate maximising the ELBO (empirical Bayes, as in Deterministic VI, Wu et al.
    2019). ``prior="learned"`` is ``LearnedPrior()``.

    A layer with this prior has a site ``"<layer>.weight_prior_scale"`` (and, with
    ``bias_prior="learned"``, ``"<layer>.bias_prior_scale"``, one per layer) whose prior is
    :class:`~pyro_dropout.distributions.EmpiricalBayesScale`. Every guide of this library emits
    there the closed-form optimum, :math:`s^2` = the mean over the group of
    :math:`\mathbb E_q[w^2]` (the minimiser of the analytic KL of each of the four families),
    so each fitted guide carries its own scale: ``guide.median()["<layer>.weight_prior_scale"]``.

    :param str per: ``"layer"`` (one scale per weight tensor) or ``"unit"`` (one per input unit
        or channel: automatic relevance determination of the inputs).
    :param float init_scale: the scale of prior-predictive draws (and of the guides' set-up run).

    Biases keep ``Normal(0, 1)`` unless ``bias_prior="learned"``: a group of weights whose means
    all start at 0 (biases) under a guide with a small fixed posterior SD σ (MC dropout's slab)
    has the fitted scale σ, whose weight decay 1/σ² then holds it at 0: the profiled KL is
    :math:`\tfrac K2 \log \overline{m^2 + σ^2}`, a log penalty that prunes whole groups
    (automatic relevance determination); a group that starts at 0 is pruned from the start.
    """

    per: str = "layer"
    init_scale: float = 1.0

    def __post_init__(self):
        _check_per(self.per)
        _positive(self.init_scale, "init_scale")


@dataclass(frozen=True)
class HyperPrior:
    r"""Weight prior :math:`w \mid λ \sim \mathcal N(0, 1/λ)` with a hyperprior
    :math:`λ \sim \mathrm{Gamma}(a, b)` on the precision, inferred by the guide with the
    weights. ``prior="hyper"`` is ``HyperPrior()``.

    A layer with this prior has a latent site ``"<layer>.weight_prior_precision"`` (and, with
    ``bias_prior="hyper"``, ``"<layer>.bias_prior_precision"``). The guides of this
    library give a positive site a mean-field log-normal factor; its KL against the Gamma is
    analytic (:func:`~pyro_dropout.distributions.kl_lognormal_gamma`), and the weights' KL is the
    family's analytic KL given a draw of λ.

    :param str per: ``"layer"`` or ``"unit"`` (one precision per input unit or channel).
    :param float concentration: :math:`a` (default 1: an exponential prior on λ).
    :param float rate: :math:`b` (default 0.01: prior mean precision 100, i.e. a weight scale of
        0.1, with 1 % of its mass below λ = 1; a weak prior for standardised data).
    """

    per: str = "layer"
    concentration: float = 1.0
    rate: float = 0.01

    def __post_init__(self):
        _check_per(self.per)
        _positive(self.concentration, "concentration")
        _positive(self.rate, "rate")


def hierarchical_prior(prior):
    """``prior`` as a :class:`LearnedPrior` or :class:`HyperPrior` (the strings ``"learned"``
    and ``"hyper"`` included), or None for any other specification."""
    if isinstance(prior, LearnedPrior | HyperPrior):
        return prior
    if isinstance(prior, str):
        if prior == "learned":
            return LearnedPrior()
        if prior == "hyper":
            return HyperPrior()
    return None


def group_shape(spec, shape):
    """The shape of a hierarchical prior's scale site for a parameter of ``shape``: ``()`` per
    layer, ``(in,)`` per input unit (dimension 1 of a weight; a bias has no units)."""
    if spec.per == "unit" and len(shape) >= 2:
        return torch.Size(shape[1:2])
    return torch.Size()


def reduce_dims(spec, shape):
    """The (negative) dimensions of a parameter of ``shape`` that one scale covers."""
    n = len(shape)
    if spec.per == "unit" and n >= 2:
        return tuple(d - n for d in range(n) if d != 1)
    return tuple(range(-n, 0))


def hyper_site_prior(spec, weight_site, shape, dtype=None, device=None):
    """The prior of the scale site (:class:`LearnedPrior`) or precision site
    (:class:`HyperPrior`) of a parameter of ``shape``."""
    group = group_shape(spec, shape)
    dtype = dtype or torch.get_default_dtype()
    if isinstance(spec, LearnedPrior):
        return EmpiricalBayesScale(
            weight_site,
            reduce_dims(spec, shape),
            event_shape=group,
            init_scale=spec.init_scale,
            dtype=dtype,
            device=device,
        )
    a = torch.tensor(spec.concentration, dtype=dtype, device=device)
    b = torch.tensor(spec.rate, dtype=dtype, device=device)
    return Gamma(a, b).expand(group).to_event(len(group))


def scaled_normal(scale, spec, shape):
    """``Normal(0, scale)`` over a parameter of ``shape`` as one event, ``scale`` being a value
    of the scale site (leading sample or plate dimensions first, then the group shape)."""
    shape = torch.Size(shape)
    group = group_shape(spec, shape)
    lead = scale.shape[: scale.dim() - len(group)]
    if len(group):  # (…, in) -> (…, 1, in, 1, …)
        scale = scale.reshape(lead + (1,) + group + (1,) * (len(shape) - 2))
    else:
        scale = scale.reshape(lead + (1,) * len(shape))
    return Normal(torch.zeros_like(scale), scale).expand(lead + shape).to_event(len(shape))


def make_prior(
    prior: "PriorSpec",
    shape: tuple[int, ...] | torch.Size,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Distribution:
    """Build the prior over a parameter tensor of ``shape`` as one event.

    :param prior: ``None`` (``Normal(0, 1)``), a positive number ``s`` (``Normal(0, s)``), a
        scalar distribution (expanded elementwise, e.g. ``ImproperLogUniform()`` or
        ``Normal(0., 0.1)``), a distribution whose ``batch_shape + event_shape`` already equals
        ``shape``, or a callable ``shape -> distribution``.
    :returns: a distribution with ``batch_shape == ()`` and ``event_shape == shape``.
    """
    shape = torch.Size(shape)
    if callable(prior) and not isinstance(prior, Distribution):
        prior = prior(shape)
    if prior is None:
        prior = 1.0
    if isinstance(prior, numbers.Real) and not isinstance(prior, bool):
        if prior <= 0:
            raise ValueError(f"prior scale must be positive, got {prior}")
        zero = torch.zeros((), device=device, dtype=dtype or torch.get_default_dtype())
        return Normal(zero, zero + prior).expand(shape).to_event(len(shape))
    if not isinstance(prior, Distribution):
        got = repr(prior) if isinstance(prior, str) else type(prior).__name__
        raise TypeError(
            "prior must be None, a positive number (the scale of a zero-mean Normal), a "
            f"distribution, a callable returning one, 'learned' or 'hyper'; got {got}"
        )
    full = prior.batch_shape + prior.event_shape
    if full == shape:
        # (Pyro distributions, the documented input, have to_event)
        return prior.to_event(len(prior.batch_shape)) if prior.batch_shape else prior  # type: ignore[attr-defined]
    if prior.event_shape == () and prior.batch_shape == ():
        return prior.expand(shape).to_event(len(shape))
    raise ValueError(
        f"prior has batch_shape {tuple(prior.batch_shape)} and event_shape "
        f"{tuple(prior.event_shape)}; expected a scalar distribution or one of total shape "
        f"{tuple(shape)}"
    )


#: A prior as the layers and models take it (see :func:`make_prior`): None (``Normal(0, 1)``),
#: a positive scale, a distribution, a callable ``shape -> distribution``, or a learned scale
#: (:class:`LearnedPrior`, :class:`HyperPrior`, or their names ``"learned"`` and ``"hyper"``).
PriorSpec: TypeAlias = (
    float
    | TorchDistribution
    | Callable[[torch.Size], TorchDistribution]
    | LearnedPrior
    | HyperPrior
    | Literal["learned", "hyper"]
    | None
)

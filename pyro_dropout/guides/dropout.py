"""MC dropout as Bernoulli variational inference (Gal & Ghahramani 2016)."""

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from .._checks import is_positive
from ..distributions import BernoulliMaskedNormal
from ..distributions.vector_weight import VectorWeight
from .base import AutoWeightGuide
from .init import init_to_fan_in

__all__ = ["AutoDropout"]


class AutoDropout(AutoWeightGuide):
    r"""MC-dropout guide: :class:`~pyro_dropout.BernoulliMaskedNormal` at every weight site.

    Weights (sites with at least two event dims, first = outputs; and weight vectors, 1-D
    sites the model uses as a product's weight, ``x @ w``, read as a one-output layer) get
    :math:`W = M\,\mathrm{diag}(z) + σ ε`, :math:`z \sim \mathrm{Bernoulli}(1-p)` per input unit,
    with learned :math:`M` and fixed drop rate :math:`p` and slab scale :math:`σ`; other real
    sites (biases) get :math:`\mathcal N(b, σ^2)` with no dropout (Gal & Ghahramani 2016,
    appendix). The weights that read the model's inputs keep them all by default
    (``input_dropout_rate=0``): dropout on hidden units. Under
    :func:`~pyro_dropout.local_reparameterization` a layer then computes
    exactly standard dropout on its input plus the slab noise; with a prior
    :math:`\mathcal N(0, l^{-2})` the KL is the weight decay :math:`\tfrac{(1-p)l^2}{2}\|M\|^2`
    (see :func:`~pyro_dropout.infer.gal_tau`).

    :param dropout_rate: drop probability ``p`` (``torch.nn.Dropout`` convention): one float for
        every weight site that does not read the model's inputs, a mapping ``{site_name: p}``
        naming every weight site (the inputs' layers included), or a tensor broadcastable to
        every weight site's mask shape (e.g. ``(G, 1, 1, 1)`` for weights in a plate of G
        hyper-parameter configurations at dim -2).
    :param input_dropout_rate: drop probability of the weight sites that read the model's
        inputs (a tensor passed to the model, or a view of it: an MLP's first layer, a CNN's
        first convolution, ``x @ w`` on the data): default ``0``, every input feature kept,
        as dropout is usually placed on hidden units. Dropping inputs is a choice for many
        redundant features (Gal's UCI code drops them at the same rate); on a network with
        one input it makes a fraction ``p`` of the draws predict as if ``x = 0``. A float or a
        tensor, as ``dropout_rate``; not with a mapping (which names every site's rate).
    :param float scale: the slab standard deviation σ (fixed unless ``learn_scale``).
    :param bool learn_scale: learn a per-weight σ (softplus-parameterised) instead.
    :param str name: prefix of the parameters in Pyro's param store (default: the class name,
        the same in every process; see the docs page *Saving and loading*).

    ``init_loc_fn`` gives initial posterior *means* :math:`E[W] = (1-p)M`.

    The analytic KL is registered against Normal priors (Gal's approximation). With any other
    prior (e.g. :class:`~pyro_dropout.ImproperLogUniform`) ``TraceMeanField_ELBO`` falls back to a
    Monte-Carlo KL from the exact mixture ``log_prob``: correct but noisier.

    Example::

        model = BayesianMLP(8, 1, hidden=(50,), tau=10.0, prior=1 / 0.01)
        guide = AutoDropout(model, dropout_rate=0.05)
        fit(model, guide, x, y, num_epochs=400, batch_size=128)
    """

    family = "mc_dropout"

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        dropout_rate: float | Mapping[str, float] | torch.Tensor = 0.1,
        input_dropout_rate: float | torch.Tensor | None = None,
        scale: float = 0.01,
        learn_scale: bool = False,
        init_loc_fn: Callable[[dict], torch.Tensor] = init_to_fan_in,
        create_plates: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(dropout_rate, Mapping):
            for key, p in dropout_rate.items():
                _check_rate(p, f"dropout_rate[{key!r}]")
            dropout_rate = {key: float(p) for key, p in dropout_rate.items()}
            if input_dropout_rate is not None:
                raise ValueError(
                    "input_dropout_rate is not used with a dropout_rate mapping, which names "
                    "the rate of every weight site (the inputs' layers included): put the "
                    "input layers' rate in the mapping"
                )
        else:
            dropout_rate = _rate_arg(dropout_rate, "dropout_rate")
            input_dropout_rate = _rate_arg(
                0.0 if input_dropout_rate is None else input_dropout_rate, "input_dropout_rate"
            )
        if not is_positive(scale):
            raise ValueError(f"scale must be positive, got {scale}")
        super().__init__(model, init_loc_fn=init_loc_fn, create_plates=create_plates, name=name)
        self.dropout_rate = dropout_rate  # after Module.__init__: it may be a tensor
        self.input_dropout_rate = input_dropout_rate
        self.scale = float(scale)
        self.learn_scale = bool(learn_scale)

    @property
    def config(self) -> dict[str, Any]:
        rate, inputs = self.dropout_rate, self.input_dropout_rate
        config = {
            "dropout_rate": rate.tolist() if torch.is_tensor(rate) else rate,
            "scale": self.scale,
            "learn_scale": self.learn_scale,
        }
        if inputs is not None:  # None with a mapping, which names every site's rate
            config["input_dropout_rate"] = inputs.tolist() if torch.is_tensor(inputs) else inputs
        return config

    def _build_from_prototype(self, *args, **kwargs):
        self._rates = {}
        super()._build_from_prototype(*args, **kwargs)
        if not isinstance(self.dropout_rate, dict):
            self._warn_if_nothing_is_dropped()
        if isinstance(self.dropout_rate, dict):
            unknown = sorted(set(self.dropout_rate) - set(self._rates))
            missing = sorted(n for n, p in self._rates.items() if p is None)
            if unknown or missing:
                raise ValueError(
                    "dropout_rate mapping must name exactly the weight sites "
                    f"{sorted(self._rates)}; unknown: {unknown}, missing: {missing}"
                )

    def _warn_if_nothing_is_dropped(self):
        """Never silent: a model whose every weight site reads its inputs (a linear model,
        ``x @ w``) gets no dropout at all from a rate the default keeps off its inputs."""
        rates = list(self._rates.values())
        asked = torch.as_tensor(self.dropout_rate)
        if rates and all(n in self._input_sites for n in self._rates) and bool((asked > 0).any()):
            if not bool((torch.as_tensor(self.input_dropout_rate) > 0).any()):
                warnings.warn(
                    f"AutoDropout: every weight site ({', '.join(sorted(self._rates))}) reads "
                    "the model's inputs, which input_dropout_rate (default 0) keeps: "
                    f"dropout_rate={self.config['dropout_rate']} drops nothing. Pass "
                    "input_dropout_rate=p to drop input features.",
                    UserWarning,
                    stacklevel=4,
                )

    def _is_weight(self, site):
        # A layer's weight (first event dim = outputs), or a weight vector (x @ w): a
        # one-output layer, with one mask value per input.
        return len(site["fn"].event_shape) >= 2 or site["name"] in self._vector_weights

    def _init_real_site(self, name, site, init_mean):
        n = init_mean.dim()
        if self._is_weight(site):
            if isinstance(self.dropout_rate, dict):
                rate = self.dropout_rate.get(name)
            elif name in self._input_sites:
                rate = self.input_dropout_rate
            else:
                rate = self.dropout_rate
            self._rates[name] = rate
            keep = 1.0 - (0.0 if rate is None else rate)
            if torch.is_tensor(keep):
                keep = keep.to(init_mean.device)
            # init_loc_fn gives E[W] = (1 - p) M.
            self._set("locs", name, PyroParam(init_mean / keep, constraints.real, n))
        else:
            self._set("locs", name, PyroParam(init_mean.clone(), constraints.real, n))
        if self.learn_scale:
            scale = torch.full_like(init_mean, self.scale)
            self._set("scales", name, PyroParam(scale, constraints.softplus_positive, n))

    def _scale(self, name, like):
        if self.learn_scale:
            return self._get("scales", name)
        return torch.tensor(self.scale, dtype=like.dtype, device=like.device)

    def _real_site_dist(self, name, site):
        loc = self._get("locs", name)
        scale = self._scale(name, loc)
        if name in self._rates:
            rate = torch.as_tensor(self._rates[name], dtype=loc.dtype, device=loc.device)
            if name in self._vector_weights:  # the one-output layer w[None, :]
                layer = BernoulliMaskedNormal(_row(loc), _row(scale), rate, event_dim=2)
                return VectorWeight(layer)
            return BernoulliMaskedNormal(loc, scale, rate, event_dim=self._event_dims[name])
        return dist.Normal(loc, scale.expand(loc.shape)).to_event(self._event_dims[name])


def _row(t):
    """A vector ``batch + (in,)`` as the one-output layer ``batch + (1, in)`` (scalars as is)."""
    return t.unsqueeze(-2) if t.dim() else t


def _rate_arg(rate, what):
    """A rate argument as a float, or a tensor of rates (kept as is, cloned)."""
    if torch.is_tensor(rate) and rate.numel() > 1:
        # A tensor of rates broadcast to each weight site's mask shape
        # (batch_shape + (1,) + event_shape[1:]), e.g. one rate per member of a plate.
        if not ((rate >= 0) & (rate < 1)).all():
            raise ValueError(f"{what} must hold drop probabilities in [0, 1)")
        return rate.detach().clone()
    _check_rate(rate, what)
    return float(rate)


def _check_rate(p, what):
    try:  # numbers incl. numpy scalars and 0-d tensors; not strings or bools
        ok = not isinstance(p, str | bool) and 0 <= float(p) < 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a drop probability in [0, 1), got {p!r}")

"""Variational dropout with learned α (Kingma et al. 2015; sparse VD, Molchanov et al. 2017)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from .._checks import is_positive
from ..distributions import LogAlphaNormal
from .base import AutoWeightGuide
from .init import init_to_fan_in

__all__ = ["AutoVariationalDropout", "SparsityReport", "LOG_ALPHA_CLIP"]

#: Range accepted for ``init_log_alpha`` (the ±8 of Molchanov et al. 2017's code). The
#: variance is not clipped (see :class:`AutoVariationalDropout`).
LOG_ALPHA_CLIP = (-8.0, 8.0)


@dataclass
class SparsityReport:
    """Result of :meth:`AutoVariationalDropout.sparsity`.

    :ivar fraction: fraction of all weights with log α above the threshold.
    :vartype fraction: float
    :ivar per_site: that fraction per weight site.
    :vartype per_site: dict
    :ivar masks: boolean keep-masks (True = keep) per weight site.
    :vartype masks: dict
    """

    fraction: float
    per_site: dict
    masks: dict


class AutoVariationalDropout(AutoWeightGuide):
    r"""Gaussian dropout guide :math:`q(w) = \mathcal N(θ, α θ^2)` with learned log α.

    * ``alpha="weight"`` (sparse VD, Molchanov et al. 2017): one α per weight, through the
      *additive* parameterisation — learn θ and :math:`\log σ^2` directly, so the gradient
      w.r.t. θ does not carry the multiplicative noise; :math:`\log α = \log σ^2 - \log θ^2`.
    * ``alpha="unit"``: one α per input unit (column), as Gaussian dropout on the layer input.
    * ``alpha="layer"``: one α per weight site (Kingma et al. 2015's "variational dropout A").

    The emitted variance is exactly :math:`σ^2`: ``exp(log σ²)`` for ``alpha="weight"`` (the
    guide's own parameter, as the noise in Molchanov et al.'s code) and :math:`θ^2 α` for
    ``"unit"``/``"layer"`` (formed in log space, so it stays finite at θ = 0, where log α
    alone overflows float32's exp for σ² ≥ 5); nothing is clipped, so training, prediction,
    export and the KL see one distribution. (An earlier version clipped log α to ±8 with straight-through gradients
    when forming σ: the clip made σ depend on θ while the gradient said it did not, and with a
    Normal prior the fits under-fitted badly.) The log-uniform KL clamps log α to
    :data:`~pyro_dropout.distributions.kl.LOG_ALPHA_RANGE` = ±30 internally, where
    Molchanov's curve is flat. A weight vector (a 1-D site the model uses as a product's
    weight, ``x @ w``) is a one-output layer: one α per weight for ``"weight"`` and ``"unit"``.
    Biases and other 1-D sites get a mean-field Normal.

    Priors: with a Normal prior the KL is torch's exact ``KL(Normal ‖ Normal)``; with
    :class:`~pyro_dropout.ImproperLogUniform` it is the registered approximation (Molchanov by
    default), which drives α up and weights to zero. :meth:`sparsity` reports the weights with
    log α above a threshold (3 in Molchanov et al.: dropout rate above 95 %).

    :param float init_log_alpha: initial log α of every weight (with ``alpha="weight"``,
        exactly so for initial means |θ| ≫ 1e-4: σ² starts at (θ² + 1e-8)·α, a floor that keeps
        a weight initialised at 0 from starting with no variance at all).
    :param float init_scale: initial posterior sd of non-weight (bias) sites.
    :param str name: prefix of the parameters in Pyro's param store (default: the class name,
        the same in every process; see the docs page *Saving and loading*).

    Example::

        model = BayesianMLP(784, 10, hidden=(300, 100), likelihood="classification",
                            prior=ImproperLogUniform())
        guide = AutoVariationalDropout(model, alpha="weight")
        fit(model, guide, x, y, num_epochs=50, batch_size=128)
        print(guide.sparsity(threshold=3.0).fraction)
    """

    family = "variational_dropout"

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        alpha: Literal["weight", "unit", "layer"] = "weight",
        init_log_alpha: float = -6.0,
        init_scale: float = 0.01,
        init_loc_fn: Callable[[dict], torch.Tensor] = init_to_fan_in,
        create_plates: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if alpha not in ("weight", "unit", "layer"):
            raise ValueError(f"alpha must be 'weight', 'unit' or 'layer', got {alpha!r}")
        lo, hi = LOG_ALPHA_CLIP
        if isinstance(init_log_alpha, (bool, str)) or not lo <= init_log_alpha <= hi:
            raise ValueError(f"init_log_alpha must lie in {LOG_ALPHA_CLIP}, got {init_log_alpha}")
        if not is_positive(init_scale):
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.alpha = alpha
        self.init_log_alpha = float(init_log_alpha)
        self.init_scale = float(init_scale)
        super().__init__(model, init_loc_fn=init_loc_fn, create_plates=create_plates, name=name)

    @property
    def config(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "init_log_alpha": self.init_log_alpha,
            "init_scale": self.init_scale,
        }

    def _build_from_prototype(self, *args, **kwargs):
        self._weights = set()
        super()._build_from_prototype(*args, **kwargs)

    def _init_real_site(self, name, site, init_mean):
        n = init_mean.dim()
        self._set("locs", name, PyroParam(init_mean.clone(), constraints.real, n))
        event = site["fn"].event_shape
        vector = name in self._vector_weights  # x @ w: a one-output layer
        if len(event) < 2 and not vector:
            scale = torch.full_like(init_mean, self.init_scale)
            self._set("scales", name, PyroParam(scale, constraints.softplus_positive, n))
            return
        self._weights.add(name)
        if self.alpha == "weight":
            log_sigma2 = torch.log(init_mean**2 + 1e-8) + self.init_log_alpha
            self._set("log_sigma2", name, PyroParam(log_sigma2, constraints.real, n))
        else:
            batch = init_mean.shape[: init_mean.dim() - len(event)]
            # one α per input unit (for a weight vector: per weight) or per site
            unit = event if vector else (1,) + event[1:]
            shape = batch + (unit if self.alpha == "unit" else (1,) * len(event))
            log_alpha = torch.full(
                shape, self.init_log_alpha, dtype=init_mean.dtype, device=init_mean.device
            )
            self._set("log_alphas", name, PyroParam(log_alpha, constraints.real, n))

    def log_alpha(self, name: str) -> torch.Tensor:
        """log α of weight site ``name``, broadcast to the weight's shape: ``log σ² − log θ²``
        for ``alpha="weight"`` (θ² floored at the dtype's tiny, the floor
        :class:`~pyro_dropout.distributions.LogAlphaNormal` uses, so its variance is exactly
        σ²), the parameter itself otherwise."""
        theta = self._get("locs", name)
        if self.alpha == "weight":
            tiny = torch.finfo(theta.dtype).tiny
            return self._get("log_sigma2", name) - torch.log(theta * theta + tiny)
        return self._get("log_alphas", name).expand(theta.shape)

    def _real_site_dist(self, name, site):
        loc = self._get("locs", name)
        event_dim = self._event_dims[name]
        if name not in self._weights:
            return dist.Normal(loc, self._get("scales", name)).to_event(event_dim)
        if self.alpha == "weight":  # variance exp(log σ²); log α when a KL reads it
            log_sigma2 = self._get("log_sigma2", name)
            return LogAlphaNormal.from_log_variance(loc, log_sigma2).to_event(event_dim)
        # variance (θ² + tiny) α
        return LogAlphaNormal(loc, self.log_alpha(name)).to_event(event_dim)

    @torch.no_grad()
    def sparsity(self, threshold: float = 3.0) -> SparsityReport:
        """Fraction of weights with log α > ``threshold`` (prunable) and keep-masks per site."""
        if self.prototype_trace is None:
            raise RuntimeError("AutoVariationalDropout.sparsity: fit or call the guide first")
        masks, per_site, dropped, total = {}, {}, 0, 0
        for name in sorted(self._weights):
            prune = self.log_alpha(name) > threshold
            masks[name] = ~prune
            per_site[name] = float(prune.float().mean())
            dropped += int(prune.sum())
            total += prune.numel()
        return SparsityReport(dropped / max(total, 1), per_site, masks)

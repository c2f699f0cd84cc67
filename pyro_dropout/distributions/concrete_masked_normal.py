r"""Concrete dropout's variational family: Bernoulli-masked weights whose drop rate is learned
through a Concrete (relaxed Bernoulli) mask."""

import math
from typing import Any, Self

import torch
from torch.distributions import Distribution, constraints

from .._broadcast import broadcast_shape, unexpand
from .bernoulli_masked_normal import BernoulliMaskedNormal

__all__ = ["ConcreteMaskedNormal", "RelaxedDensityError", "concrete_keep_mask"]


class RelaxedDensityError(RuntimeError):
    """Raised when the log density of a relaxed :class:`ConcreteMaskedNormal` is
    differentiated (what :class:`pyro.infer.Trace_ELBO` does with the guide's draws)."""


RELAXED_LOG_PROB_MESSAGE = (
    "ConcreteMaskedNormal.log_prob was differentiated for a relaxed family (relaxed=True: "
    "AutoConcreteDropout while training). Its rsample draws Concrete-relaxed masks, which have "
    "no closed-form density, and log_prob is the density of the hard family q, so an "
    "objective that scores the guide's own draws (pyro.infer.Trace_ELBO, or a Monte-Carlo KL "
    "where no analytic KL is registered) would optimise the wrong quantity. Train with "
    "pyro_dropout.infer.MeanFieldELBO (or pyro.infer.TraceMeanField_ELBO) and a Normal prior: "
    "they use the analytic KL(q || p) and never differentiate log q. (For log densities of "
    "hard draws from q, build the family with relaxed=False or call guide.eval().)"
)


class _RefuseGradient(torch.autograd.Function):
    """Identity whose backward raises :class:`RelaxedDensityError`."""

    @staticmethod
    def forward(ctx, log_prob):
        return log_prob.view_as(log_prob)

    @staticmethod
    def backward(ctx, grad):
        raise RelaxedDensityError(RELAXED_LOG_PROB_MESSAGE)


def concrete_keep_mask(
    dropout_rate: torch.Tensor,
    temperature: float,
    shape: tuple[int, ...] | torch.Size,
    relaxed: bool = True,
    dropout_logit: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""A keep mask of ``shape`` for drop rates ``dropout_rate`` (broadcastable to ``shape``).

    Relaxed (Maddison et al. 2017; Jang et al. 2017; as in Gal, Hron & Kendall 2017):

    .. math::

        \tilde z = \sigma\!\Big(\frac{\operatorname{logit} p + \log u - \log(1-u)}{t}\Big),
        \quad u \sim \mathcal U(0, 1), \qquad \text{keep} = 1 - \tilde z,

    differentiable in ``p``; as :math:`t \to 0` it tends to a hard Bernoulli(p) drop indicator.
    ``relaxed=False`` draws the hard mask :math:`\mathbb 1[u \ge p]` (keep with probability
    :math:`1-p`), through which no gradient flows to ``p``. ``dropout_logit``, where given, is
    :math:`\operatorname{logit} p` (the relaxed mask then reads it instead of computing it).
    """
    rate = dropout_rate
    u = torch.rand(shape, dtype=rate.dtype, device=rate.device)
    if not relaxed:
        return (u >= rate).to(rate.dtype)
    # keep = 1 - sigmoid(a / t) = sigmoid(-a / t) (no cancellation near keep = 0), with
    # a = logit p + logit u. Per element: logit u (clamped: rand can return exactly 0), one
    # add that also scales it (``alpha``: one pass where a scale and an add take two) and the
    # sigmoid; this mask is in every training step.
    # (logit p is one operation where log p - log(1 - p) is four: it runs per layer and step.)
    scale = -1.0 / temperature
    noise = torch.logit(u, eps=torch.finfo(rate.dtype).eps)
    logit = torch.logit(rate) if dropout_logit is None else dropout_logit
    return torch.sigmoid(torch.add(logit * scale, noise, alpha=scale))


def _compact(rate, ndim):
    """``rate`` without its broadcast dims, with ``ndim`` dims: what the local
    reparameterisation rule and the KL compute with. (Why not ``dropout_rate``, expanded to
    the mask's shape: a compiled loss would run the expansion, and per-unit terms computed on
    every expanded element, and their backward, on every step.)"""
    rate = unexpand(rate)
    return (
        rate.reshape((1,) * (ndim - rate.dim()) + tuple(rate.shape)) if rate.dim() < ndim else rate
    )


class ConcreteMaskedNormal(BernoulliMaskedNormal):
    r"""The Bernoulli-masked weight family of MC dropout with a *learnable* drop rate.

    The family :math:`q` is the one of :class:`BernoulliMaskedNormal`,

    .. math::

        W = M \odot z + \sigma \odot \varepsilon, \qquad z \sim \mathrm{Bernoulli}(1 - p),

    except that **one mask value is shared by all weights that read one input unit**: ``z``
    has shape ``batch_shape + (1, in) + (1,) * (event_dim - 2)``, so for a convolution kernel
    ``(out, in, kh, kw)`` it drops whole input *channels* (spatial / channel-wise dropout, the
    convolutional variant of Gal, Hron & Kendall); for a Linear weight ``(out, in)`` it is
    exactly :class:`BernoulliMaskedNormal`'s mask.

    Two ways to draw (why: the drop rate ``p`` must receive a gradient during training, and
    predictions must come from :math:`q` itself):

    * :meth:`rsample` with ``relaxed=True`` replaces ``z`` by the Concrete relaxation
      :func:`concrete_keep_mask` at temperature ``temperature`` (Gal, Hron & Kendall 2017,
      eq. 5), differentiable in ``loc``, ``scale`` **and** ``dropout_rate``. These draws come
      from the relaxed distribution, not from :math:`q`.
    * :meth:`sample`, and :meth:`rsample` with ``relaxed=False``, draw hard Bernoulli masks:
      exact draws from :math:`q` (no gradient to ``p``).

    :meth:`log_prob` and the registered KL (:func:`~pyro_dropout.distributions.kl_concrete_masked_normal_normal`)
    are those of the hard family :math:`q`: the density of a relaxed draw has no closed form
    (a continuous mixture over the relaxed mask), and the objective of Concrete dropout is
    :math:`\mathbb E_{\tilde q}[\log p(y\mid W)] - \mathrm{KL}(q\,\|\,p)`, the relaxation
    entering only the reparameterised likelihood term. So with ``relaxed=True`` the value of
    :meth:`log_prob` may be computed (Pyro's ``TraceMeanField_ELBO`` computes and discards it)
    but not differentiated: its backward raises :class:`RelaxedDensityError`, naming
    ``MeanFieldELBO``, instead of letting ``Trace_ELBO`` optimise the hard density at relaxed
    draws (a mask a little off 0 or 1 puts the draw far out in the Gaussian tails: on a
    3-50-1 network, minimum −6,939 over 200 relaxed draws, against 583 at hard ones).

    :param torch.Tensor loc: :math:`M` (the weight when kept; :math:`\mathbb E W = (1-p)M`).
    :param scale: slab standard deviation :math:`\sigma > 0`, broadcastable to ``loc``.
    :param dropout_rate: drop probability :math:`p \in (0, 1)` (open: the relaxation needs
        :math:`\operatorname{logit} p`), broadcastable to :attr:`mask_shape`.
    :param dropout_logit: instead of ``dropout_rate`` (give exactly one, as ``probs`` and
        ``logits`` of :class:`torch.distributions.Bernoulli`): :math:`\operatorname{logit} p`,
        :math:`p = \sigma(\text{dropout\_logit})`. The mask and the KL then read the logit
        itself: no ``logit`` of a rate, and the Bernoulli entropy as
        :math:`p\operatorname{logit}p - \operatorname{softplus}(\operatorname{logit} p)`
        rather than two ``xlogy`` (fewer operations per step, and no round trip through
        :math:`p` that loses the logit's precision where :math:`p` is near 1).
        :class:`~pyro_dropout.AutoConcreteDropout` builds its families this way.
    :param float temperature: Concrete temperature :math:`t > 0` (default 0.1, the paper's).
    :param bool relaxed: whether :meth:`rsample` uses the relaxed mask (default True).
    :param int event_dim: rightmost dims of ``loc`` forming one event; at least 2 (output and
        input units).
    """

    arg_constraints = {
        "loc": constraints.real,
        "scale": constraints.positive,
        "dropout_rate": constraints.interval(0.0, 1.0),
    }

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor | float,
        dropout_rate: torch.Tensor | float | None = None,
        temperature: torch.Tensor | float = 0.1,
        relaxed: bool = True,
        event_dim: int | None = None,
        validate_args: bool | None = None,
        *,
        dropout_logit: torch.Tensor | float | None = None,
    ) -> None:
        loc = torch.as_tensor(loc)
        if (dropout_rate is None) == (dropout_logit is None):
            raise ValueError(
                "ConcreteMaskedNormal: give exactly one of dropout_rate and dropout_logit, got "
                f"{'both' if dropout_rate is not None else 'neither'}"
            )
        logit = None
        if dropout_rate is None:
            dtype = loc.dtype if torch.is_floating_point(loc) else torch.get_default_dtype()
            logit = torch.as_tensor(dropout_logit, dtype=dtype, device=loc.device)
            dropout_rate = torch.sigmoid(logit)
        if event_dim is None:
            event_dim = loc.dim()
        if not isinstance(event_dim, int) or event_dim < 2:
            raise ValueError(
                f"ConcreteMaskedNormal: event_dim must be an int >= 2 (output and input units), "
                f"got {event_dim!r}"
            )
        if isinstance(temperature, bool) or not float(temperature) > 0:
            raise ValueError(f"ConcreteMaskedNormal: temperature must be > 0, got {temperature!r}")
        super().__init__(loc, scale, dropout_rate, event_dim=event_dim, validate_args=False)
        rate = torch.as_tensor(dropout_rate, dtype=self.loc.dtype, device=self.loc.device)
        shape = self.mask_shape
        try:
            ok = broadcast_shape(shape, rate.shape) == shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"ConcreteMaskedNormal: dropout_rate of shape {tuple(rate.shape)} must broadcast "
                f"to the mask shape {tuple(shape)} (batch_shape + (1, in) + (1,) * "
                f"(event_dim - 2): one rate per input unit or channel at most)"
            )
        self.dropout_rate = rate.expand(shape)
        self._compact_rate = _compact(rate, len(shape))
        #: logit p on the compact rates where the family was built from ``dropout_logit``
        self._compact_logit = None if logit is None else _compact(logit, len(shape))
        self.temperature = float(temperature)
        self.relaxed = bool(relaxed)
        # BernoulliMaskedNormal was built unvalidated (its [0, 1) rate check is not ours): take
        # the caller's flag, else torch's global default, and check the arguments here.
        self._validate_args = (
            Distribution._validate_args if validate_args is None else bool(validate_args)
        )
        if self._validate_args:
            for name in ("loc", "scale", "dropout_rate"):
                value = getattr(self, name)
                if not self.arg_constraints[name].check(value).all():
                    raise ValueError(
                        f"ConcreteMaskedNormal: {name} must satisfy "
                        f"{self.arg_constraints[name]}, got {value}"
                    )
            if not ((self.dropout_rate > 0) & (self.dropout_rate < 1)).all():
                raise ValueError(
                    "ConcreteMaskedNormal: dropout_rate must lie in the open interval (0, 1)"
                    + (
                        ""
                        if logit is None
                        else " (it is sigmoid(dropout_logit): keep |logit| "
                        "within the dtype's range, e.g. below 15.9 for float32)"
                    )
                )

    #: The mean weight :math:`\mathbb E W = (1-p)M` where the family was built by
    #: :meth:`from_mean` (``batch_shape + event_shape``), else ``None``.
    mean_weight: torch.Tensor | None = None
    _loc: torch.Tensor | None = None

    @classmethod
    def from_mean(
        cls,
        mean: torch.Tensor,
        scale: torch.Tensor | float,
        dropout_rate: torch.Tensor | float | None = None,
        temperature: torch.Tensor | float = 0.1,
        relaxed: bool = True,
        event_dim: int | None = None,
        **kwargs: Any,
    ) -> Self:
        r"""The family whose *mean* weight is ``mean``: :math:`M = \text{mean} / (1-p)`, the
        parameterisation of inverted dropout (Gal, Hron & Kendall's reference code's
        :math:`W'`; :class:`~pyro_dropout.AutoConcreteDropout`'s ``locs``).

        The same distribution as ``ConcreteMaskedNormal(mean / (1 - p), ...)``; it also keeps
        ``mean`` as :attr:`mean_weight`, which the local-reparameterisation rule and the KL
        read instead of :math:`M`: :math:`\mathrm{op}(x \odot z / (1-p), \text{mean})` and
        :math:`\|\text{mean}\|^2 / (1-p)`. Why: dividing every weight by :math:`1-p`, and
        that division's backward, cost 0.4× a plain ``nn.Dropout`` step on the speed
        benchmark's W2 network (784-400-400-10, batch 128); a compiled loss that never reads
        :attr:`loc` drops the division as dead code. As in the constructor, ``dropout_logit=``
        may be given instead of ``dropout_rate``.
        """
        if not torch.is_tensor(mean):
            mean = torch.as_tensor(mean)
        if not torch.is_floating_point(mean):
            mean = mean.to(torch.get_default_dtype())
        # The rate or, with ``dropout_logit=``, its logit (the constructor checks that exactly
        # one is given), as a tensor of the mean's dtype and device.
        key = "dropout_rate" if kwargs.get("dropout_logit") is None else "dropout_logit"
        given = dropout_rate if key == "dropout_rate" else kwargs.pop("dropout_logit")
        if given is not None and not (
            torch.is_tensor(given) and given.dtype == mean.dtype and given.device == mean.device
        ):
            given = torch.as_tensor(given, dtype=mean.dtype, device=mean.device)
        if key == "dropout_logit":
            kwargs["dropout_logit"] = given
        # Built (and validated) with the mean weight in M's place, for the shapes; M itself is
        # computed when first read (an eager step that never reads it saves its division too).
        shape = mean.shape if given is None else broadcast_shape(mean.shape, given.shape)
        rate = given if key == "dropout_rate" else dropout_rate
        new = cls(mean.expand(shape), scale, rate, temperature, relaxed, event_dim, **kwargs)
        new.mean_weight = mean.expand(new.batch_shape + new.event_shape)
        new._loc = None
        return new

    @property
    def loc(self) -> torch.Tensor:
        """:math:`M`, the weight when kept (for a family built by :meth:`from_mean`,
        ``mean_weight / (1 - p)``, computed when first read)."""
        if self._loc is None and self.mean_weight is not None:
            self._loc = self.mean_weight / (1 - self.dropout_rate)
        return self._loc  # type: ignore[return-value]  # set by __init__ or from_mean

    @loc.setter
    def loc(self, value: torch.Tensor) -> None:
        self._loc = value

    @property
    def mean(self) -> torch.Tensor:
        return super().mean if self.mean_weight is None else self.mean_weight

    @property
    def mask_shape(self) -> torch.Size:
        """``batch_shape + (1, in) + (1,) * (event_dim - 2)``: one mask per input unit/channel."""
        return self.batch_shape + (1, self.event_shape[1]) + (1,) * (len(self.event_shape) - 2)

    @property
    def dropout_logit(self) -> torch.Tensor:
        """:math:`\\operatorname{logit} p`, of :attr:`dropout_rate`'s shape (the given logit where
        the family was built from ``dropout_logit``, else computed from the rate)."""
        logit = self._compact_logit
        if logit is None:
            logit = torch.logit(self._compact_rate)
        return logit.expand(self.dropout_rate.shape)

    def expand(self, batch_shape: tuple[int, ...], _instance: Self | None = None) -> Self:
        new = self._get_checked_instance(ConcreteMaskedNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.mean_weight = None
        if self.mean_weight is not None:
            new.mean_weight = self.mean_weight.expand(batch_shape + self.event_shape)
        if self._loc is None:  # from_mean's M, not read yet: new computes its own when read
            new._loc = None
        else:
            new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.scale = self.scale.expand(batch_shape + self.event_shape)
        new.dropout_rate = self.dropout_rate.expand(
            batch_shape + self.dropout_rate.shape[len(self.batch_shape) :]
        )
        new._compact_rate = _compact(self._compact_rate, new.dropout_rate.dim())
        new._compact_logit = (
            None
            if self._compact_logit is None
            else _compact(self._compact_logit, new.dropout_rate.dim())
        )
        new.temperature = self.temperature
        new.relaxed = self.relaxed
        super(BernoulliMaskedNormal, new).__init__(
            batch_shape, self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    def _mask_shape(self, sample_shape):
        return torch.Size(sample_shape) + self.mask_shape

    def sample_mask(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        """A hard Bernoulli(1 - p) keep mask of shape ``sample_shape + mask_shape``."""
        with torch.no_grad():
            rate = self.dropout_rate.detach()
            return concrete_keep_mask(rate, self.temperature, self._mask_shape(sample_shape), False)

    def rsample(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        if self.relaxed:
            logit = None if self._compact_logit is None else self.dropout_logit
            z = concrete_keep_mask(
                self.dropout_rate, self.temperature, self._mask_shape(sample_shape), True, logit
            )
        else:
            z = self.sample_mask(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return z * self.loc + self.scale * eps

    def sample(self, sample_shape: tuple[int, ...] = torch.Size()) -> torch.Tensor:
        # A draw from q itself: hard masks, whatever ``relaxed`` says.
        with torch.no_grad():
            shape = self._extended_shape(sample_shape)
            z = self.sample_mask(sample_shape)
            eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
            return z * self.loc + self.scale * eps

    def _group_dims(self):
        """Event dims along which one mask value is shared: the output dim and the kernel dims."""
        return (-self.event_dim,) + tuple(range(-self.event_dim + 2, 0))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r"""Exact log density of the hard family :math:`q`: per input unit :math:`c` (all
        weights sharing its mask), :math:`\log[(1-p_c)\mathcal N(w_c; m_c, \sigma_c^2) +
        p_c\mathcal N(w_c; 0, \sigma_c^2)]`, summed over units. Not the density of a relaxed
        draw (which has none in closed form): for a relaxed family (``relaxed=True``) its
        backward raises :class:`RelaxedDensityError` (see the class docs)."""
        if self._validate_args:
            self._validate_sample(value)
        dims = self._group_dims()
        log_norm = -torch.log(self.scale) - 0.5 * math.log(2 * math.pi)
        on = (log_norm - 0.5 * ((value - self.loc) / self.scale) ** 2).sum(dims, keepdim=True)
        off = (log_norm - 0.5 * (value / self.scale) ** 2).sum(dims, keepdim=True)
        p = self.dropout_rate
        log_mix = torch.logaddexp(torch.log1p(-p) + on, torch.log(p) + off)
        log_prob = log_mix.sum(tuple(range(-self.event_dim, 0)))
        if self.relaxed and log_prob.requires_grad:
            log_prob = _RefuseGradient.apply(log_prob)
        return log_prob

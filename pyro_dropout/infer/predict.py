"""Monte-Carlo prediction for any Pyro model: vectorised where the model broadcasts."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyro
import torch

from .conform import check_guide_matches, check_target_shape, conform_data
from .data import as_tensor
from .draws import CHUNK_ELEMENTS, OBS_SAMPLE, RETURN_SITE, DistDraws, run_draws
from .draws.modes import module_mode as _module_mode

__all__ = ["predict", "Prediction", "CHUNK_ELEMENTS"]

#: Draws per chunk when evaluating log densities over many draws (bounds the memory).
_EVAL_DRAWS = 256


@dataclass
class Prediction:
    r"""Monte-Carlo predictions: ``T`` posterior draws for ``N`` points.

    Summaries of the observed site, for every likelihood whose distribution can be rebuilt
    from its parameters (Gaussian, heteroscedastic Gaussian, Poisson, StudentT, a user's
    ``torch.distributions`` subclass, ...), with :math:`p(y \mid θ_t)` the draw-``t``
    distribution:

    * :attr:`mean` :math:`= \frac1T \sum_t E[y \mid θ_t]`;
    * :attr:`variance` by the law of total variance, :math:`E_t[\mathrm{Var}(y \mid θ_t)]`
      (:attr:`aleatoric_variance`) :math:`+ \mathrm{Var}_t[E(y \mid θ_t)]`
      (:attr:`epistemic_variance`), from each draw's ``mean`` and ``variance`` (``inf`` or
      ``nan`` where the distribution's own variance is, e.g. a StudentT with ``df <= 2``);
    * :meth:`log_likelihood` :math:`= \log \frac1T \sum_t p(y_i \mid θ_t)`.

    Classification (a discrete site with enumerable support: Categorical, Bernoulli,
    Binomial) has :attr:`probs` ``(N, K)`` over the support's values instead: :attr:`mean` is
    ``probs`` and :attr:`variance` ``probs (1 - probs)`` per value (for a Bernoulli site
    column 1 holds :math:`E[y]` and :math:`\mathrm{Var}(y)`); :attr:`mutual_information` is
    its epistemic part. A distribution that cannot be rebuilt from its parameters keeps one
    predictive draw of ``y`` per θ draw in ``samples``: their mean and variance estimate the
    predictive mean and total variance, and :meth:`log_likelihood` is not available.

    :ivar samples: ``(T, N, ...)``. For the observed site (the default of :func:`predict`):
        per draw, the mean of its distribution (regression; a draw of ``y`` for a family
        without a mean) or its logits (classification); for another site, its values.
    :vartype samples: torch.Tensor
    :ivar likelihood: a likelihood module, for predictions built from network outputs alone
        (``Prediction(samples, GaussianLikelihood(tau=...))``).
    :ivar site: the predicted site.
    :ivar draws: the observed site's distribution per draw
        (:class:`~pyro_dropout.infer.draws.DistDraws`), or None for a value site.
    :ivar note: why ``draws`` is None for the observed site (its family cannot be rebuilt).
    """

    samples: torch.Tensor
    likelihood: object = None
    site: str | None = None
    draws: DistDraws | None = None
    note: str | None = None

    def __post_init__(self):
        if self.draws is None and self.likelihood is not None:
            fn = getattr(self.likelihood, "predictive_distribution", lambda f: None)(self.samples)
            if fn is not None:
                from .draws import _dist_params

                info = _dist_params(fn)
                if info is not None:
                    self.draws = DistDraws(*info)

    # -- the observed site's distribution --------------------------------------------------
    def _dist(self, what):
        if self.draws is None:
            if self.note is not None:
                raise AttributeError(f"{what}: {self.note}")
            raise AttributeError(
                f"{what} needs the observed site's distribution; this prediction holds the "
                f"values of site {self.site!r} (predict(..., site=None) predicts the observed "
                "site)"
            )
        return self.draws.dist()

    @property
    def kind(self) -> str | None:
        """``"classification"`` (a discrete observed site with enumerable support),
        ``"regression"`` (a real-valued one), or None (a count site such as Poisson, a value
        site)."""
        if self.draws is None:
            return getattr(self.likelihood, "kind", None)
        d = self.draws.dist()
        if d.has_enumerate_support:
            return "classification"
        if d.support.is_discrete:
            return None
        return "regression"

    def _need(self, kind, what):
        if self.kind != kind:
            raise AttributeError(f"{what} is defined for {kind} models (this one: {self.kind})")

    def _moment(self, name, what):
        """Per draw ``E[y | θ_t]`` or ``Var(y | θ_t)``, ``(T, N, ...)``, of a non-classification
        observed site; a clear error where the family does not define it."""
        if self.kind == "classification":
            raise AttributeError(
                f"{what} is defined for regression and count models (a real or discrete "
                "observed site without enumerable support); this one is classification: use "
                "probs, variance (probs (1 - probs)), entropy and mutual_information (its "
                "epistemic part)"
            )
        d = self._dist(what)
        try:
            return getattr(d, name)
        except NotImplementedError:
            raise AttributeError(
                f"{what}: the observed site's distribution {self.draws.cls.__name__} "
                f"does not define its {name}; estimate it by Monte Carlo from one y per θ "
                "draw: y = pred.draws.dist().sample() (shape (T, N, ...)), then y.mean(0) "
                "and y.var(0) are the predictive mean and total variance"
            ) from None

    # -- moments ---------------------------------------------------------------------------
    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean ``E_t[E[y | θ_t]]`` (regression, counts), mean class probabilities
        (classification), or the mean of a value site's draws."""
        if self.draws is None:
            return self.samples.mean(0)
        if self.kind == "classification":
            return self.probs
        return self._moment("mean", "mean").mean(0)

    @property
    def epistemic_variance(self) -> torch.Tensor:
        """``Var_t[E(y | θ_t)]``: the variance over the T draws of each draw's mean (model
        uncertainty)."""
        return self._moment("mean", "epistemic_variance").var(0, unbiased=False)

    @property
    def aleatoric_variance(self) -> torch.Tensor:
        """``E_t[Var(y | θ_t)]``: the observation noise, averaged over the draws (for a
        Poisson site the mean rate)."""
        return self._moment("variance", "aleatoric_variance").mean(0)

    @property
    def variance(self) -> torch.Tensor:
        """Total predictive variance by the law of total variance: aleatoric + epistemic
        (regression, counts); ``p(1-p)`` per class (classification); the variance of a
        value site's draws."""
        if self.draws is None:
            return self.samples.var(0, unbiased=False)
        if self.kind == "classification":
            return self.probs * (1 - self.probs)
        return self.epistemic_variance + self.aleatoric_variance

    @property
    def stddev(self) -> torch.Tensor:
        return self.variance.sqrt()

    # -- classification --------------------------------------------------------------------
    def _class_log_probs(self):
        d = self._dist("class probabilities")
        support = d.enumerate_support(expand=False)  # (K, 1, ..., 1)
        return d.log_prob(support).movedim(0, -1)  # (T, N, K)

    @property
    def probs(self) -> torch.Tensor:
        """MC-averaged class probabilities, ``(N, classes)``."""
        self._need("classification", "probs")
        return self._class_log_probs().exp().mean(0)

    @property
    def entropy(self) -> torch.Tensor:
        """Predictive entropy ``H[E_t p_t]`` (total uncertainty), nats."""
        p = self.probs
        return -(torch.xlogy(p, p)).sum(-1)

    @property
    def mutual_information(self) -> torch.Tensor:
        """``H[E_t p_t] − E_t H[p_t]`` (epistemic part; BALD), nats."""
        log_p = self._class_log_probs()
        expected = -(log_p.exp() * log_p).sum(-1).mean(0)
        return self.entropy - expected

    # -- scores ----------------------------------------------------------------------------
    def pointwise_log_likelihood(self, y: torch.Tensor | np.ndarray) -> torch.Tensor:
        """``log p(y_i | θ_t)``, shape ``(T, N)``."""
        d0 = self._dist("log_likelihood")
        y = _target_like(y, d0, self.site)
        out = []
        for start in range(0, self.draws.num_draws, _EVAL_DRAWS):
            d = self.draws.dist(slice(start, start + _EVAL_DRAWS))
            out.append(d.log_prob(y))
        return torch.cat(out, 0)

    def log_likelihood(self, y: torch.Tensor | np.ndarray) -> torch.Tensor:
        r"""Per-point MC predictive log density of ``y``, shape ``(N,)``:
        :math:`\log \frac1T \sum_t p(y_i \mid θ_t)` (for a Gaussian with fixed τ, Gal &
        Ghahramani's test log-likelihood)."""
        lp = self.pointwise_log_likelihood(y)
        return torch.logsumexp(lp, 0) - math.log(lp.shape[0])


def _mean_or_draw(d):
    try:
        return d.mean
    except NotImplementedError:  # a family without a mean: a draw has the dtype too
        return d.sample()


def _target_like(y, d, site="obs"):
    """``y`` as a tensor laid out like one draw of ``d`` (rows first), on its device: the
    target rule of :mod:`~pyro_dropout.infer.conform` (a trailing axis of size 1 is added or
    dropped, another shape is refused; integer labels cast to the site's dtype)."""
    y = as_tensor(y, "y")
    shape = tuple(d.batch_shape[1:] + d.event_shape)
    y = check_target_shape(y, shape, "y", site)
    like = d.sample() if d.support.is_discrete else _mean_or_draw(d)
    if d.support.is_discrete and torch.is_floating_point(y):
        bad = y != y.round()
        if bad.any():
            row = int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0, 0]) if y.dim() else 0
            raise ValueError(
                f"y must hold whole numbers for the discrete observed site {site!r}; row {row} "
                f"holds {y[row].tolist() if y.dim() else y.item()}"
            )
    return y.to(dtype=like.dtype, device=like.device)


@torch.no_grad()
def predict(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor | np.ndarray,
    num_samples: int = 100,
    chunk_size: int | None = None,
    local_reparameterization: bool = False,
    seed: int | None = None,
    *,
    site: str | None = None,
    vectorize: bool | Literal["auto"] = "auto",
    estimator: str = "auto",
    module_mode: Literal["eval", "train"] = "eval",
    **model_kwargs: Any,
) -> Prediction:
    """Draw ``num_samples`` posterior predictions for inputs ``x`` from any Pyro model.

    Runs the guide and replays the model (as ``pyro.infer.Predictive``), in vectorised chunks
    of draws when the model broadcasts over a leading sample dimension and one draw per pass
    when it does not (CNNs with ``MaxPool2d``/``Flatten``): the same distribution either way.
    A subsampled data plate is given every row.

    By default each draw is one network from the guide applied to all ``N`` rows (weight draws,
    also inside an enclosing ``local_reparameterization()`` block, as for the ArviZ export):
    the joint predictive of q, so a draw is a coherent function of ``x``.
    ``local_reparameterization=True`` samples pre-activations per example instead (for
    :class:`~pyro_dropout.AutoDropout`, a fresh mask per row, as ``nn.Dropout`` does): the same
    predictive distribution at every point, independent across points. Weight draws are the
    default because they are also the cheaper of the two: the per-example estimators draw
    noise for every (draw, row, unit), the weights only per (draw, weight) (measured with 100
    draws on 1,000 rows: 0.47× against 1.54× the time of a plain loop of dropout forwards of
    an 8-50-1 net; ``docs/benchmarks/speed.md``).

    :param x: inputs, ``N`` rows (tensor or numpy array; floating arrays are cast to the
        model's dtype, see :func:`~pyro_dropout.infer.data.as_model_input`).
    :param site: what to predict: None (default) for the observed site, found as the one sample
        site the guide does not draw; the name of another sample or deterministic site; or
        ``"_RETURN"`` for the model's return value.
    :param chunk_size: draws per vectorised pass; by default the first draw measures the
        widest layer output and the passes keep it near :data:`CHUNK_ELEMENTS` (1M elements on
        a CPU, where cache-sized passes are fastest; 64M elsewhere).
    :param vectorize: ``"auto"``, ``True`` (error when the model does not broadcast) or
        ``False`` (one draw per pass, no warning). A model that raises on a vectorised pass
        makes ``"auto"`` draw one per pass with one
        :class:`~pyro_dropout.infer.draws.VectorizationWarning` naming the exception.
        Before its first vectorised pass the run checks that the model gives the first draw's results when that draw is replayed vectorised
        (:mod:`~pyro_dropout.infer.draws.verify`): a module that mistakes the draws for rows
        (``BatchNorm1d(H)`` on ``N == H`` rows) makes ``"auto"`` draw one per pass, with a
        :class:`~pyro_dropout.infer.draws.VectorizationWarning`, and ``True`` raise.
    :param str module_mode: ``"eval"`` (default): every ``torch.nn`` module of the model and
        guide runs in eval mode (``BatchNorm`` uses its running statistics, ``nn.Dropout`` is
        off); ``"train"`` runs them in train mode (MC dropout through the model's own
        ``nn.Dropout``). Either way each module's mode and every buffer (``BatchNorm``'s
        running statistics, ``num_batches_tracked``) are as before afterwards, also after an
        error (:func:`~pyro_dropout.infer.draws.modes.module_mode`).
    :param bool local_reparameterization: sample pre-activations per example instead of
        weights (see above).
    :param estimator: with local reparameterisation, how each layer is sampled per example
        (see :func:`~pyro_dropout.local_reparameterization`; default ``"auto"``).
    :param model_kwargs: further keyword arguments of the model (and guide).
    :returns: a :class:`Prediction` with ``samples`` of shape ``(T, N, ...)``.

    Example::

        pred = predict(model, guide, x_test, num_samples=100)
        pred.mean, pred.variance, pred.log_likelihood(y_test)
    """
    if getattr(guide, "prototype_trace", True) is None:
        raise RuntimeError(
            "predict: the guide has not been fitted (its prototype trace is empty); call fit() "
            "or run the guide once with the training data (x, y) first"
        )
    if isinstance(num_samples, bool) or not int(num_samples) >= 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}")
    if chunk_size is not None and not int(chunk_size) >= 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    with _module_mode(model, guide, mode=module_mode):
        x, _, probe, _ = conform_data(
            model, x, None, who="predict", guide=guide, kwargs=model_kwargs, finite=False
        )
        check_guide_matches(probe.trace, guide, "predict")
        if seed is not None:
            pyro.set_rng_seed(seed)
        run = run_draws(
            model,
            guide,
            [((x,), model_kwargs)],
            int(num_samples),
            obs_name=site if site not in (None, RETURN_SITE) else None,
            find_obs=site is None,
            obs_optional=site is not None,
            value_sites=() if site is None else (site,),
            estimator=estimator if local_reparameterization else "weights",
            vectorize=vectorize,
            chunk_size=chunk_size,
        )
    draws = run.obs[0] if run.obs_name is not None else None
    likelihood = getattr(model, "likelihood", None)
    if draws is not None:
        d = draws.dist()
        if d.has_enumerate_support and "logits" in draws.params:
            samples = d.logits
        else:
            samples = _mean_or_draw(d)  # without a mean: one y per draw
        return Prediction(samples, likelihood, run.obs_name, draws)
    if site is None:  # the observed site's family cannot be rebuilt: keep predictive draws
        family = run.obs_family[0] if run.obs_family else "distribution"
        note = (
            f"the observed site's distribution ({family}) cannot be rebuilt from its "
            "parameters (its constructor does not take the names in its arg_constraints), so "
            "this prediction holds one predictive draw of y per θ draw (samples): mean and "
            "variance estimate the predictive moments from them; for log densities give the "
            "class a constructor taking its arg_constraints names"
        )
        return Prediction(run.values[0][OBS_SAMPLE], None, run.obs_name, None, note)
    return Prediction(run.values[0][site], None, site, None)

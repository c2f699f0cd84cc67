r"""Local reparameterisation: sample pre-activations instead of weights.

Kingma, Salimans & Welling (2015): for a factorised Gaussian weight posterior the pre-activation
``b = x W^T`` of each example is Gaussian with mean ``x μ^T`` and variance ``x² (σ²)^T``, so one
can sample ``b`` directly with independent noise per example. The estimator has the same
expectation as weight sampling and a much lower variance (the noise is no longer shared across
the minibatch).

Design. Under this messenger every latent sample site that is drawn fresh (the guide's draw in
SVI and in ``Predictive``; the prior's when no guide is replayed) records its distribution by
name. The operations that consume a weight are then answered by a rule registered for that
family (:func:`register_local_reparameterization`) instead of by the drawn weights:

* the library's layers call the effectful op :func:`~pyro_dropout.nn.functional.bayesian_layer`
  with the site names of their weight and bias;
* any other code (``PyroModule[nn.Linear]``, ``PyroModule[nn.Conv2d]``, a functional model's
  ``x @ w.T``) receives at each guided site a :class:`~pyro_dropout.nn.guided_value.GuidedValue`,
  an alias of the drawn tensor whose linear, matmul and convolution operations are routed here.

Tokens and sets. A Linear layer's input ``(sample dims..., B, T..., d)`` has ``B`` examples of
``T...`` tokens each (the example axis leads, as for ``nn.Linear``'s ``(*, H_in)`` and a
convolution's ``N``; :func:`~pyro_dropout.nn.functional.token_layout`). One weight draw serves
all tokens of an example under q, so per-token noise would be another model's (ten identical
tokens, mean-pooled, got a tenth of q's variance). There ``"auto"`` shares the draw over the
tokens: Flipout with signs per example for the Gaussian families, masks per example plus a
Flipout slab for the dropout families (rules marked ``exact_for_tokens``). An enclosing
vectorised plate that the weight does not vary along, whose size is not ``B``, contradicts
that reading: the site is then used as drawn, with a warning naming it (``strict=True``
raises). Inputs ``(B, d)`` take the per-unit LRT path unchanged.

Nothing is monkey-patched. A weight that reaches an operation without a rule (an elementwise
use, an unsupported op, a family without a rule) is used as drawn, and the messenger warns once
per site naming the site and the operation (``strict=True`` raises instead).

A site used by more than one operation in one run of the model (tied weights, a layer applied
twice) is sampled once per run and used as drawn at every use, with one warning per site:
per-example noise at each use would give each use its own weights, a different model. The
library's guides announce such sites on their draws (``infer={"weight_uses": n}``, counted in
their set-up run), so this holds from the first use; otherwise the messenger finds the reuse at
the second use, and the run in which it did mixed the two.

The innermost messenger of this class decides: :func:`weight_draws` (``estimator="weights"``)
inside a ``local_reparameterization()`` block gives weight draws again, broadcast over sample
dimensions, which is how code that promises weight draws (``predict(...,
local_reparameterization=False)``, the ArviZ export) protects itself from an enclosing context.
"""

import copy
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Self, TypeVar, overload

import pyro
import torch
from pyro.distributions import Delta
from pyro.poutine.indep_messenger import IndepMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import Distribution, Independent, Normal, constraints

from .._broadcast import ntuple
from ..nn.functional import (
    ConvSpec,
    LayoutError,
    LinearSpec,
    add_bias,
    align_to_frames,
    apply_spec,
    check_linear_input,
    read_rows,
    token_layout,
    unexpand,
)
from ..nn.guided_value import GuidedValue, SiteRecord, laid_out, plain, wrap
from .lrt_rules import (
    VARIANCE_FLOOR,
    GaussianPreactivation,
    _per_example_shape,
    sample_gaussian_preactivation,
)
from .registry import ESTIMATORS as RULE_ESTIMATORS
from .registry import lookup_rule, register_local_reparameterization

_T = TypeVar("_T")
_D = TypeVar("_D", bound=Distribution)

__all__ = [
    "LocalReparameterizationMessenger",
    "LocalReparameterizationWarning",
    "local_reparameterization",
    "register_local_reparameterization",
    "weight_draws",
]

#: ``"auto"``: ``"lrt"`` for Linear layers on ``(B, d)`` inputs; for convolutions (Linear
#: layers on token inputs ``(B, T..., d)``) an ``"lrt"`` rule marked ``exact_for_conv``
#: (``exact_for_tokens``: the dropout families' masks), else ``"flipout"`` for families that
#: have a Flipout rule (Gaussian ones), else ``"per_example"``; then the names of
#: :data:`~pyro_dropout.handlers.registry.ESTIMATORS` applied to every layer, and
#: ``"weights"`` (the drawn weights, shared by the minibatch).
ESTIMATORS = ("auto", *RULE_ESTIMATORS, "weights")


class LocalReparameterizationWarning(UserWarning):
    """A guided weight site was used without local reparameterisation (see the message)."""


def _strip(fn):
    while isinstance(fn, Independent):
        fn = fn.base_dist
    return fn


def _is_real(support):
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real or type(support) is type(constraints.real)


def _align_batch(fn: _D, batch_shape: torch.Size) -> _D | None:
    """Give ``fn`` the batch shape of the weights the model actually received.

    ``Predictive(parallel=True)`` vectorises the guide at its own plate depth (often dim -1)
    and then reshapes the samples for the model (dim -2 with a data plate), so the recorded
    guide distribution can carry the same batch in a different layout. Only singleton dims
    differ, so every batched parameter tensor can be reshaped. Returns None when the sizes
    differ: then the weights did not come from this draw (e.g. ``Predictive``'s shape-probing
    run from the prior) and the layer uses its weights.
    """
    if fn.batch_shape == batch_shape:
        return fn
    if fn.batch_shape.numel() != batch_shape.numel():
        return None
    new = copy.copy(fn)
    n = len(fn.batch_shape)
    for key, value in vars(fn).items():
        if torch.is_tensor(value) and value.shape[:n] == fn.batch_shape:
            setattr(new, key, value.reshape(batch_shape + value.shape[n:]))
        elif isinstance(value, Distribution) and value.batch_shape == fn.batch_shape:
            setattr(new, key, _align_batch(value, batch_shape))  # e.g. VectorWeight's layer
    new._batch_shape = batch_shape
    return new


class LocalReparameterizationMessenger(Messenger):
    """Pyro messenger under which the operations consuming guided weights sample
    pre-activations (see the module docs). Use it through :func:`local_reparameterization`
    or :func:`weight_draws`.

    :param str estimator: how a layer's output is sampled per example, one of
        :data:`ESTIMATORS`: ``"auto"`` (default: exact local reparameterisation for Linear
        layers, exact-for-q estimators for convolutions), ``"lrt"``, ``"flipout"``,
        ``"per_example"``, or ``"weights"`` (the drawn weights, with linear and convolution
        operations broadcast over their sample dims). See ``docs/local-reparameterization.md``
        for what each is exact for and what it costs.
    :param bool strict: raise ``NotImplementedError`` instead of warning when a guided weight
        is used without a rule.

    Caveat: inside one context, the *latest* fresh draw at a site defines its distribution. A
    model later run with conditioned weights (``poutine.condition``,
    ``Predictive(posterior_samples=...)``) in the same context still samples from that
    distribution, not from the given weights; run such code outside the context or inside
    :func:`weight_draws`. (Sequential ``Predictive(guide=...)`` conditions the model on guide
    draws and relies on exactly this.)
    """

    def __init__(self, estimator: str = "auto", strict: bool = False) -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        super().__init__()
        self.estimator = estimator
        self.strict = bool(strict)
        #: Sites found used more than once in one model run while this messenger answered
        #: them (not only announced by the guide): kept across re-entries of this instance, and
        #: part of :attr:`jit_key`, so a compiled loss traced before the discovery is retraced.
        self._learned_reuse: set[str] = set()
        self._reset()

    def _reset(self) -> None:
        self._dists: dict[str, Distribution] = {}
        self._fresh: set[int] = set()  # id()s of the messages of fresh draws
        self._warned: set[tuple[str, str]] = set()
        #: site -> count of values drawn for the model (reuse detection)
        self._generation: dict[str, int] = {}
        #: site -> (generation, rule-answerable uses of that value so far)
        self._uses: dict[str, tuple[int | None, int]] = {}
        #: site -> rank of its Linear input in a run without weight draws (see _draw_tokens)
        self._input_rank: dict[str, int] = {}
        #: Sites used as drawn at every use because the model uses them more than once per run.
        self._reused: set[str] = set(self._learned_reuse)
        self._active = False
        #: Elements of the largest layer output answered here (sizes prediction passes).
        self.widest_output = 0

    @property
    def jit_key(self) -> tuple[type, str, frozenset[str]]:
        """What a compiled loss depends on (see :class:`~pyro_dropout.infer.JitMeanFieldELBO`)."""
        return (type(self), self.estimator, frozenset(self._learned_reuse))

    def __enter__(self) -> Self:
        self._reset()
        self._active = True
        return super().__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._active = False
        super().__exit__(exc_type, exc_value, traceback)

    def _is_innermost(self):
        for m in reversed(_PYRO_STACK):
            if isinstance(m, LocalReparameterizationMessenger):
                return m is self
        return False

    # -- recording draws -------------------------------------------------------------------
    def _pyro_sample(self, msg):
        # A value already set here was replayed (the model half of SVI/Predictive) or
        # observed; only fresh draws say which distribution the weights come from.
        if not msg["is_observed"] and msg["value"] is None:
            self._fresh.add(id(msg))

    def _pyro_post_sample(self, msg):
        # Record after every handler has run, so plates entered outside this one have
        # broadcast the distribution too.
        fresh = id(msg) in self._fresh
        self._fresh.discard(id(msg))
        if site_is_subsample(msg) or msg["infer"].get("is_auxiliary"):
            return
        name = msg["name"]
        if fresh:
            self._dists[name] = msg["fn"]
            if msg["infer"].get("weight_uses", 1) > 1:
                # The guide saw the model use this site more than once in one run (its
                # prototype run, see AutoWeightGuide): weight draws from the first use on.
                self._reused.add(name)
        if name not in self._dists:
            return
        value, fn = msg["value"], msg["fn"]
        if not (torch.is_tensor(value) and value.is_floating_point()):
            return
        event_dim = fn.event_dim
        if event_dim < 1 or not _is_real(fn.support):
            return
        self._generation[name] = self._generation.get(name, 0) + 1
        if self._is_innermost():
            value = plain(value)
            laid_out = align_to_frames(value, event_dim, msg["cond_indep_stack"])
            site = SiteRecord(name, event_dim, self, self._model_run(), laid_out)
            msg["value"] = wrap(value, site)

    # -- answering operations --------------------------------------------------------------
    def _pyro_bayesian_layer(self, msg):
        if msg["done"] or not self._is_innermost():
            return  # an inner messenger of this class answered (or will)
        x, weight, bias = msg["args"]
        spec = msg["kwargs"]["spec"]
        name = msg["name"]
        fn = self._dists.get(name)
        event = None if fn is None else len(fn.event_shape)
        msg["value"] = self._answer(
            name, x, plain(weight), event, plain(bias), msg["kwargs"].get("bias_name"), spec
        )
        msg["done"] = True

    def answer_linear(
        self,
        x: torch.Tensor,
        w: GuidedValue,
        bias: torch.Tensor | None,
        transposed_layout: bool,
    ) -> torch.Tensor:
        """``F.linear`` / ``matmul`` of ``x`` with the guided value ``w`` (called by
        :class:`~pyro_dropout.nn.guided_value.GuidedValue`)."""
        site = w._pd_site
        spec = LinearSpec(transposed=transposed_layout, vector=site.event_dim == 1)
        return self._answer_op(x, site, bias, spec)

    def answer_conv(
        self,
        x: torch.Tensor,
        w: GuidedValue,
        bias: torch.Tensor | None,
        ndim: int,
        stride: int | tuple[int, ...],
        padding: str | int | tuple[int, ...],
        dilation: int | tuple[int, ...],
        groups: int,
    ) -> torch.Tensor:
        """``F.conv1d`` / ``F.conv2d`` of ``x`` with the guided kernel ``w``."""
        site = w._pd_site
        if site.event_dim != ndim + 2:  # part of the kernel is batch: no rule, as drawn
            self.unsupported_use(
                site, f"F.conv{ndim}d with a kernel of {site.event_dim} event dims"
            )
            fn = torch.conv1d if ndim == 1 else torch.conv2d
            return fn(x, laid_out(w), laid_out(bias), stride, padding, dilation, groups)
        padding = padding if isinstance(padding, str) else ntuple(padding, ndim)
        spec = ConvSpec(ndim, ntuple(stride, ndim), padding, ntuple(dilation, ndim), groups)
        return self._answer_op(x, site, bias, spec)

    def _answer_op(self, x, site, bias, spec):
        bias_value = laid_out(bias)
        if not self._active:  # the value outlived its context: plain weights
            return apply_spec(x, site.value, bias_value, spec)
        bias_name = bias._pd_site.name if _is_guided(bias) else None
        return self._answer(site.name, x, site.value, site.event_dim, bias_value, bias_name, spec)

    def _answer(self, name, x, weight, event_dim, bias, bias_name, spec):
        check_linear_input(x, weight, spec, name)
        out = None
        # A site used more than once in one run is used as drawn at every use (one draw from
        # q shared by the uses, as the model says); its bias likewise.
        reused = self._note_use(name)
        if bias_name is not None and self._note_use(bias_name):
            bias_name = None  # add the drawn bias
        if self.estimator != "weights" and not reused:
            out = self._lrt(name, x, weight, event_dim, bias, bias_name, spec)
        if out is None:  # weight draws, broadcast over their sample dims
            try:
                tokens = self._draw_tokens(name, x, weight, spec)
                out = apply_spec(x, weight, bias, spec, tokens)
            except LayoutError as e:
                raise LayoutError(
                    f"weight site {name!r} (weight shape {tuple(weight.shape)}) is applied to "
                    f"an input of shape {tuple(x.shape)}: {e}"
                ) from e
        self.widest_output = max(self.widest_output, out.numel())
        return out

    def _lrt(self, name, x, weight, event_dim, bias, bias_name, spec):
        weight_fn = self._dists.get(name)
        if weight_fn is None:
            return None  # weights set by conditioning with no fresh draw here: use them
        if x.dim() > 2 and isinstance(spec, LinearSpec):  # (B, d) inputs never get here
            spec = self._token_spec(name, x, weight, spec)
            if spec is None:
                return None  # the example axis is ambiguous: weight draws (exact for q)
        base = _strip(weight_fn)
        rule = self._rule(name, base, spec)
        if rule is None:
            return None
        base = _align_batch(base, weight.shape[: weight.dim() - len(base.event_shape)])
        if base is None:
            return None
        out = rule(base, x, spec)
        bias_fn = None if bias_name is None else self._dists.get(bias_name)
        bias_base = None
        if bias is not None and bias_fn is not None:
            bias_base = _strip(bias_fn)
            if not isinstance(bias_base, Normal):
                bias_base = None  # another family: add the drawn bias, shared over the batch
            else:
                event = len(bias_base.event_shape)
                bias_base = _align_batch(bias_base, bias.shape[: bias.dim() - event])
        if isinstance(out, GaussianPreactivation):
            mean, var, sd = out
            if bias_base is not None:
                # Per-example bias noise N(μ_b, σ_b²) folded into the same Gaussian: one draw.
                mean = add_bias(mean, bias_base.loc, spec)
                bias_scale = unexpand(bias_base.scale)
                if bias_scale.numel() == 1:
                    # One bias scale for all units (AutoDropout's fixed σ): added as a scalar
                    # so the variance keeps its (…, 1) shape and the floor and square root
                    # below run per example, not per unit. In the SD form the floor is on σ_b
                    # (sqrt of the variance floor): hypot's gradient at (0, 0) is NaN, and a
                    # learned σ_b can round to 0 (a constant one is folded by the capture).
                    if sd is None:
                        var = var + bias_scale.reshape(()) ** 2
                    else:
                        floor = VARIANCE_FLOOR**0.5
                        sd = torch.hypot(sd, bias_scale.reshape(()).clamp_min(floor))
                else:
                    var, sd = add_bias(out.variance(), bias_base.scale**2, spec), None
            elif bias is not None:
                mean = add_bias(mean, bias, spec)
            batch = tuple(weight.shape[: weight.dim() - event_dim]) + (1,) * spec.feature_dims
            out = sample_gaussian_preactivation(mean, var, batch, sd)
        elif bias is not None:
            if bias_base is not None:
                bias = bias_base.loc + bias_base.scale * _randn_like(out, bias_base.loc, spec)
            out = add_bias(out, bias, spec)
        return out

    def _draw_tokens(self, name, x, weight, spec):
        """The token dims of a Linear input ``x`` that meets weight draws (None: read from the
        shapes by :func:`~pyro_dropout.nn.functional.read_rows`).

        An input ``(S, L, d)`` against draws ``(S, 1, out, in)`` is either ``S`` examples of
        ``L`` tokens (the model's data when there are as many examples as draws) or ``L``
        examples that already carry the ``S`` draws (a later layer's input): the shapes are
        the same. The input's rank at this site in a run without draws (``Predictive``'s and
        ``predict``'s first run, inside this context) tells them apart: the dims it has beyond
        that rank are draws."""
        if not isinstance(spec, LinearSpec):
            return None
        w_batch = unexpand(weight).shape[: max(weight.dim() - (1 if spec.vector else 2), 0)]
        if w_batch.numel() == 1:
            self._input_rank[name] = x.dim()
            return None
        rank = self._input_rank.get(name)
        if x.dim() < 3 or rank is None or x.dim() < rank:
            return None  # (N, d) or (S, N, d): one reading; or nothing known
        tokens, _ = read_rows(x.shape[:-1], w_batch, draws=x.dim() - rank)
        return tokens

    def _token_spec(self, name, x, weight, spec):
        """``spec`` with the token dims of ``x`` (:func:`~pyro_dropout.nn.functional.token_layout`:
        ``(sample dims..., B, T..., d)``, the example axis leading), or None when an enclosing
        plate contradicts that reading (reported; the site is then used as drawn).

        A vectorised plate the weight does not vary along is a data plate: its size must be
        the example axis's. One whose size is only a token axis's (a plate over tokens, or
        the input laid out ``(T, B, d)``) or no axis's leaves the example axis unknown, and a
        guess would silently tie the wrong outputs together (or untie the right ones)."""
        example, tokens = token_layout(x, weight, spec)
        if not tokens:
            return spec
        w_batch = unexpand(weight).shape[: weight.dim() - (1 if spec.vector else 2)]
        for plate in _PYRO_STACK:
            if not isinstance(plate, IndepMessenger) or plate.dim is None:
                continue  # not a vectorised plate
            size = getattr(plate, "subsample_size", None) or plate.size
            if size in (1, example):
                continue
            if -plate.dim <= len(w_batch) and w_batch[plate.dim] != 1:
                continue  # a sample plate (particles, predictive draws): one weight each
            self._report(
                _token_layout_message(name, x, example, tokens, plate.name, size),
                key=("tokens", name),
            )
            return None
        return dataclasses.replace(spec, tokens=len(tokens))

    def _rule(self, name, base, spec):
        """The rule for this site's family and op: the estimator asked for (for "auto":
        LRT on Linear layers; Flipout, else one weight per example, on convolutions and on
        Linear layers over tokens, unless the family's LRT rule is exact there)."""
        if isinstance(base, Delta):  # no variance: nothing to sample per example
            self._report(_no_rule_message(name, base), key=("rule", name))
            return None
        if self.estimator == "auto":
            if isinstance(spec, LinearSpec) and not spec.tokens:
                wanted = ("lrt", "per_example")
            else:
                wanted = ("flipout", "per_example")
                lrt = lookup_rule(base, "lrt")
                exact = "exact_for_conv" if isinstance(spec, ConvSpec) else "exact_for_tokens"
                if getattr(lrt, exact, False):
                    return lrt  # e.g. Concrete dropout's channel masks: exact and cheapest
        else:
            wanted = (self.estimator, "per_example")
        for estimator in wanted:
            rule = lookup_rule(base, estimator)
            if rule is not None and not (estimator == "per_example" and not base.has_rsample):
                if estimator != wanted[0] and self.estimator != "auto":
                    self._report(
                        f"local_reparameterization: no {wanted[0]!r} rule for the "
                        f"{type(base).__name__} distribution at weight site {name!r}; it is "
                        "sampled with one weight draw per example ('per_example', exact) "
                        "instead.",
                        key=("estimator", name),
                    )
                return rule
        self._report(_no_rule_message(name, base), key=("rule", name))
        return None

    # -- reporting -------------------------------------------------------------------------
    def _note_use(self, name):
        """Count a rule-answerable use (a linear or convolution op, a library layer) of the
        value now drawn at ``name``. Returns True when the site is used more than once per run
        of the model, and is therefore to be used as drawn: per-example noise at each use
        would be a different model (independent weights per use, a tied autoencoder's encoder
        and decoder no longer sharing W), not another estimator of the same objective."""
        if self.estimator == "weights" or name not in self._dists:
            return False
        gen = self._generation.get(name)
        last, count = self._uses.get(name, (None, 0))
        count = count + 1 if last == gen else 1
        self._uses[name] = (gen, count)
        if name in self._reused:
            self._report(_reuse_message(name, found_late=False), key=("reuse", name))
            return True
        if count > 1:  # found at its second use: the first was already reparameterised
            self._reused.add(name)
            self._learned_reuse.add(name)
            self._report(_reuse_message(name, found_late=True), key=("reuse", name))
            return True
        return False

    def unsupported_use(self, site: SiteRecord, op_name: str) -> None:
        """A guided value met an operation without a rule: warn once per weight site (or raise
        when ``strict``). Uses after the model returned (the ELBO's log densities, stacking
        of samples) and uses of vectors such as biases (drawn values, as sampled) are fine."""
        if not self._active or site.event_dim < 2:
            return
        if site.run is not None and not any(m is site.run for m in _PYRO_STACK):
            return  # the model run that drew it is over
        if self.estimator == "weights":
            return
        self._report(
            f"local_reparameterization: weight site {site.name!r} is used by {op_name}, which "
            "has no local-reparameterisation rule; there it is one weight draw shared by the "
            "whole minibatch (correct, but without the variance reduction). Rules exist for "
            "F.linear (PyroModule[nn.Linear]), x @ w.T, x @ w, torch.matmul/mm with the weight "
            "on the right, and F.conv1d/conv2d. Pass strict=True to make this an error.",
            key=("op", site.name),
        )

    def _model_run(self):
        """The innermost trace inside this messenger on Pyro's stack: the ``get_trace`` of the
        model (or guide) run that is drawing a site (outer traces, e.g. SVI's parameter capture,
        outlive the run); ``None`` when the model runs untraced."""
        for m in reversed(_PYRO_STACK):
            if m is self:
                return None
            if isinstance(m, TraceMessenger):
                return m
        return None

    def _report(self, message: str, key: tuple[str, str]) -> None:
        if self.strict:
            message = message.replace(
                " Pass strict=True to make this an error.",
                " This is an error because local_reparameterization(strict=True) was passed; "
                "without strict it is a warning.",
            )
            raise NotImplementedError(message)
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(
                message,
                LocalReparameterizationWarning,
                stacklevel=_user_stacklevel(sys._getframe()),
            )


#: Frames in these directories are not the user's code (the warning points past them).
_INTERNAL_DIRS = tuple(
    os.path.dirname(str(m.__file__)) + os.sep
    for m in (sys.modules[__name__.split(".")[0]], pyro, torch)
)


def _user_stacklevel(frame):
    """``stacklevel`` for a warning issued from ``frame`` (stacklevel 1): the first frame
    outside pyro_dropout, Pyro and torch, i.e. the line of the user's model that made the call.
    (The call paths have different depths, so no fixed stacklevel is right; Python 3.12's
    ``skip_file_prefixes`` does this, 3.11 does not have it.)"""
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _is_guided(t):
    return hasattr(t, "_pd_site")


def _randn_like(out, loc, spec):
    if isinstance(spec, LinearSpec):
        # Per example and unit, shared over the example's tokens like the bias itself.
        shape = _per_example_shape(out.shape, spec, spec.feature_dims)
        return torch.randn(shape, dtype=out.dtype, device=out.device)
    # Conv: bias noise per example and channel, shared over positions like the bias itself.
    return torch.randn(out.shape[: -spec.ndim], dtype=out.dtype, device=out.device)


def _no_rule_message(name, fn):
    if isinstance(fn, Delta):
        return (
            f"local_reparameterization: the guide put a Delta at weight site {name!r}, which "
            "has no variance to reparameterise, so its weights are used as drawn. Pyro's "
            "AutoNormal/AutoDelta/AutoNormalMessenger emit a Delta at each site (plus an "
            "auxiliary Normal); use pyro_dropout.AutoMeanField (or AutoDropout / "
            "AutoVariationalDropout), which put the variational distribution at the site "
            "itself, or fit without local_reparameterization."
        )
    return (
        f"local_reparameterization: no rule for the {type(fn).__name__} distribution at weight "
        f"site {name!r}, so its weights are used as drawn. Register one with "
        "pyro_dropout.handlers.register_local_reparameterization, or fit without "
        "local_reparameterization."
    )


def _token_layout_message(name, x, example, tokens, plate, size):
    return (
        f"local_reparameterization: weight site {name!r} is applied to an input of shape "
        f"{tuple(x.shape)}, read as {example} examples of {tuple(tokens)} tokens each (the "
        "leading non-sample axis is the example axis; one weight draw serves all tokens of an "
        f"example), but it runs inside pyro.plate({plate!r}) of size {size}, which is not the "
        "example axis: the layout is ambiguous, so the site is used as drawn (one weight draw "
        "shared by the minibatch: exact for q, without the variance reduction). Lay the input "
        "out as (examples, tokens..., features), or apply the layer outside that plate. Pass "
        "strict=True to make this an error."
    )


def _reuse_message(name, found_late):
    message = (
        f"local_reparameterization: site {name!r} is used by more than one operation in one "
        "run of the model (tied or shared weights, a layer applied twice, an unrolled RNN), so "
        "local reparameterisation is not applied to it: it is sampled once per run (a weight "
        "draw from q) and that draw is used at every use. This is exact for q, with a higher "
        "gradient variance than local reparameterisation."
    )
    if found_late:
        message += (
            " It was found at the second use in a run whose first use had already been "
            "sampled per example, so that one run mixed the two; every later run under this "
            "handler is exact. (The guides of this library report reused sites from their "
            "set-up run, which avoids this.)"
        )
    return message + " Pass strict=True to make this an error."


@overload
def local_reparameterization(
    fn: None = None, *, estimator: str = "auto", strict: bool = False
) -> LocalReparameterizationMessenger: ...
@overload
def local_reparameterization(
    fn: Callable[..., _T], *, estimator: str = "auto", strict: bool = False
) -> Callable[..., _T]: ...
def local_reparameterization(
    fn: Callable[..., _T] | None = None, *, estimator: str = "auto", strict: bool = False
) -> LocalReparameterizationMessenger | Callable[..., _T]:
    """Sample pre-activations instead of weights wherever a guided weight meets a linear or
    convolution operation (Kingma et al. 2015): in the library's layers, in
    ``PyroModule[nn.Linear]`` / ``PyroModule[nn.Conv1d/2d]``, and in functional models
    (``F.linear``, ``x @ w.T``, ``x @ w``, ``torch.matmul``, ``F.conv1d/2d``).

    Usable as a context manager or a decorator, around ``svi.step``, ``Predictive`` or any code
    that runs a guide then the model::

        with local_reparameterization():
            for _ in range(1000):
                svi.step(x, y)

        predictive = local_reparameterization(Predictive(model, guide=guide, num_samples=100))

    ``estimator`` picks how each layer is sampled per example (default ``"auto"``: exact local
    reparameterisation for Linear layers on ``(B, d)`` inputs; for convolutions Flipout for
    Gaussian families and one weight draw per example for MC dropout's family, both exact for
    q jointly over positions; for Linear layers on token inputs ``(B, T..., d)`` one draw per
    example shared over its tokens); ``"lrt"``, ``"flipout"`` or ``"per_example"`` apply one
    estimator everywhere (see ``docs/local-reparameterization.md``).

    A weight used by more than one operation in one run of the model (a tied autoencoder's
    ``W`` and ``W.T``, a layer applied twice) is not reparameterised: it is sampled once per
    run and used as drawn at every use (exact for q, noisier), see the module docs.

    Never silent: a guided weight used by another operation, a family without a rule (e.g. the
    Delta of Pyro's ``AutoNormal``) or a weight used twice in one run triggers a
    :class:`LocalReparameterizationWarning` once per site; ``strict=True`` raises
    ``NotImplementedError`` instead.
    """
    if estimator == "weights":
        raise ValueError("estimator='weights' samples no pre-activations: use weight_draws()")
    msngr = LocalReparameterizationMessenger(estimator=estimator, strict=strict)
    return msngr(fn) if fn is not None else msngr


@overload
def weight_draws(fn: None = None) -> LocalReparameterizationMessenger: ...
@overload
def weight_draws(fn: Callable[..., _T]) -> Callable[..., _T]: ...
def weight_draws(
    fn: Callable[..., _T] | None = None,
) -> LocalReparameterizationMessenger | Callable[..., _T]:
    """Use the drawn weights (no local reparameterisation), even inside an enclosing
    :func:`local_reparameterization` block; linear and convolution operations on guided
    weights broadcast over the weights' sample dimensions (so ``PyroModule[nn.Linear]``
    models vectorise in ``Predictive(parallel=True)``)."""
    msngr = LocalReparameterizationMessenger(estimator="weights")
    return msngr(fn) if fn is not None else msngr

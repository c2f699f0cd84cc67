r"""Local reparameterisation: sample pre-activations instead of weights.

Kingma, Salimans & Welling (2015): for a factorised Gaussian weight posterior the pre-activation
``b = x W^T`` of each example is Gaussian with mean ``x μ^T`` and variance ``x² (σ²)^T``, so one
can sample ``b`` directly with independent noise per example. The estimator has the same
expectation as weight sampling and a much lower variance (the noise is no longer shared across
the minibatch).

Design: the Bayesian layers call the effectful op :func:`~pyro_dropout.nn.functional.bayesian_layer`
with the *site names* of their weight and bias. Under this messenger, every latent sample site
that is drawn fresh (the guide's draw in SVI and in ``Predictive``; the prior's when no guide
is replayed) records its distribution by name; the layer op is then answered by a rule
registered for that distribution family (:func:`register_local_reparameterization`), instead of
by the weights. No tensor identity and no monkey-patching of ``torch.nn.functional``.
"""

import copy

import torch
from pyro.distributions import Delta
from pyro.poutine.messenger import Messenger
from torch.distributions import Independent, Normal

from ..nn.functional import LinearSpec, add_bias, unexpand
from .lrt_rules import GaussianPreactivation, sample_gaussian_preactivation
from .registry import lookup_rule, register_local_reparameterization

__all__ = [
    "LocalReparameterizationMessenger",
    "local_reparameterization",
    "register_local_reparameterization",
]


def _strip(fn):
    while isinstance(fn, Independent):
        fn = fn.base_dist
    return fn


def _align_batch(fn, batch_shape):
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
    new._batch_shape = batch_shape
    return new


class LocalReparameterizationMessenger(Messenger):
    """Pyro messenger under which Bayesian layers sample pre-activations (see module docs).

    Use through :func:`local_reparameterization` as a context manager or decorator. Sites whose
    family has no registered rule raise an error naming the fix; layers whose weights were set
    by conditioning with no fresh draw seen in this context use their weights as usual.

    Caveat: inside one context, the *latest* fresh draw at a site defines its distribution. A
    model later run with conditioned weights (``poutine.condition``,
    ``Predictive(posterior_samples=...)``) in the same context still samples from that
    distribution, not from the given weights; run such code outside the context. (Sequential
    ``Predictive(guide=...)`` conditions the model on guide draws and relies on exactly this.)
    """

    def __init__(self):
        super().__init__()
        self._dists = {}
        self._fresh = set()

    def __enter__(self):
        self._dists = {}
        self._fresh = set()
        return super().__enter__()

    def _pyro_sample(self, msg):
        # A value already set here was replayed (the model half of SVI/Predictive) or
        # observed; only fresh draws say which distribution the weights come from.
        if not msg["is_observed"] and msg["value"] is None:
            self._fresh.add(id(msg))

    def _pyro_post_sample(self, msg):
        # Record after every handler has run, so plates entered outside this one have
        # broadcast the distribution too.
        if id(msg) in self._fresh:
            self._fresh.discard(id(msg))
            self._dists[msg["name"]] = msg["fn"]

    def _pyro_bayesian_layer(self, msg):
        weight_fn = self._dists.get(msg["name"])
        if weight_fn is None:
            return
        x, weight, bias = msg["args"]
        spec = msg["kwargs"]["spec"]
        base = _strip(weight_fn)
        rule = lookup_rule(base)
        if rule is None:
            raise NotImplementedError(_no_rule_message(msg["name"], base))
        base = _align_batch(base, weight.shape[: weight.dim() - len(base.event_shape)])
        if base is None:
            return
        out = rule(base, x, spec)
        bias_name = msg["kwargs"].get("bias_name")
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
            mean, var = out
            if bias_base is not None:
                # Per-example bias noise N(μ_b, σ_b²) folded into the same Gaussian: one draw.
                mean = add_bias(mean, bias_base.loc, spec)
                bias_scale = unexpand(bias_base.scale)
                if bias_scale.numel() == 1:
                    # One bias scale for all units (AutoDropout's fixed σ): add it as a scalar
                    # so the variance keeps its (…, 1) shape and the floor and square root
                    # below run per example, not per unit.
                    var = var + bias_scale.reshape(()) ** 2
                else:
                    var = add_bias(var, bias_base.scale**2, spec)
            elif bias is not None:
                mean = add_bias(mean, bias, spec)
            out = sample_gaussian_preactivation(mean, var)
        elif bias is not None:
            if bias_base is not None:
                bias = bias_base.loc + bias_base.scale * _randn_like(out, bias_base.loc, spec)
            out = add_bias(out, bias, spec)
        msg["value"] = out
        msg["done"] = True


def _randn_like(out, loc, spec):
    if isinstance(spec, LinearSpec):
        return torch.randn(out.shape, dtype=out.dtype, device=out.device)
    # Conv: bias noise per example and channel, shared over positions like the bias itself.
    return torch.randn(out.shape[: -spec.ndim], dtype=out.dtype, device=out.device)


def _no_rule_message(name, fn):
    if isinstance(fn, Delta):
        return (
            f"local_reparameterization: the guide put a Delta at weight site {name!r}, which "
            "has no variance to reparameterise. Pyro's AutoNormal/AutoDelta/AutoNormalMessenger "
            "emit a Delta at each site (plus an auxiliary Normal); use pyro_dropout.AutoMeanField "
            "(or AutoDropout / AutoVariationalDropout), which put the variational distribution "
            "at the site itself, or fit without local_reparameterization."
        )
    return (
        f"local_reparameterization: no rule for the {type(fn).__name__} distribution at weight "
        f"site {name!r}. Register one with "
        "pyro_dropout.handlers.register_local_reparameterization, or fit without "
        "local_reparameterization."
    )


def local_reparameterization(fn=None):
    """Sample pre-activations instead of weights in every Bayesian layer (Kingma et al. 2015).

    Usable as a context manager or a decorator, around ``svi.step``, ``Predictive`` or any code
    that runs a guide then the model::

        with local_reparameterization():
            for _ in range(1000):
                svi.step(x, y)

        predictive = local_reparameterization(Predictive(model, guide=guide, num_samples=100))
    """
    msngr = LocalReparameterizationMessenger()
    return msngr(fn) if fn is not None else msngr

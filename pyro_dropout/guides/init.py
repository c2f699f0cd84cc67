"""Initial posterior means for the weight guides."""

import math
from collections.abc import Callable

import torch
from pyro.infer.autoguide.initialization import init_to_feasible

__all__ = ["dist_dtype", "init_to_fan_in", "init_to_glorot", "init_to_module"]


def dist_dtype(fn):
    """The floating dtype of a distribution's tensors (through its wrappers), or None (e.g. an
    improper prior that holds no tensor): a float64 model gets float64 guide parameters."""
    while fn is not None:
        for value in vars(fn).values():
            if torch.is_tensor(value) and value.is_floating_point():
                return value.dtype
        fn = getattr(fn, "base_dist", None)
    return None


def _uniform_weights(site, bound):
    """Shared mechanism: ``U(-b, b)`` weights (sites with >= 2 event dims, first = outputs)
    with ``b = bound(fan_in, fan_out)``, zeros for other real sites (biases), Pyro's
    ``init_to_feasible`` for constrained sites."""
    if site.get("is_observed"):
        return None
    fn = site["fn"]
    value_shape = fn.batch_shape + fn.event_shape
    support = fn.support
    while hasattr(support, "base_constraint"):
        support = support.base_constraint
    if type(support).__name__ != "_Real":
        return init_to_feasible(site)
    dtype = dist_dtype(fn) or torch.get_default_dtype()
    if len(fn.event_shape) >= 2:
        b = bound(math.prod(fn.event_shape[1:]), fn.event_shape[0])
        return (torch.rand(value_shape, dtype=dtype) * 2 - 1) * b
    return torch.zeros(value_shape, dtype=dtype)


def init_to_fan_in(site: dict) -> torch.Tensor:
    """Random fan-in scaled means: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights (sites
    with at least 2 event dims, first one = outputs, as PyTorch's Linear/Conv default), zeros for
    other real sites (biases), Pyro's ``init_to_feasible`` for constrained sites.

    Pyro's own ``init_to_feasible``/``init_to_mean`` put every weight mean at exactly 0 under a
    zero-mean prior, so all hidden units start identical and stay so.
    """
    return _uniform_weights(site, lambda fan_in, fan_out: 1.0 / math.sqrt(fan_in))


def init_to_glorot(site: dict) -> torch.Tensor:
    """Glorot-uniform means ``U(±sqrt(6 / (fan_in + fan_out)))`` (Keras' default), zero biases.

    For :class:`~pyro_dropout.AutoDropout` these are posterior means, so the guide stores
    ``M = E[W] / (1 - p)``: exactly the Keras kernel of an inverted-dropout layer.
    """
    return _uniform_weights(site, lambda fan_in, fan_out: math.sqrt(6.0 / (fan_in + fan_out)))


def init_to_module(
    module: torch.nn.Module, fallback: Callable[[dict], torch.Tensor] | None = None
) -> Callable[[dict], torch.Tensor]:
    """Initialise posterior means from a trained deterministic ``torch.nn.Module``.

    A site is matched to the parameter whose name equals the site name or is its suffix after a
    dot (so site ``"net.0.weight"`` of ``BayesianModel(bayesianize(m))`` takes ``m``'s
    ``"0.weight"``). A site without a match raises ``ValueError`` (a half-initialised network
    is rarely intended) unless a ``fallback`` init function is given, e.g. ``init_to_fan_in``.

    Example::

        net = train_plain_network()           # torch.nn.Sequential(...)
        model = BayesianModel(bayesianize(net), tau=10.0)
        guide = AutoMeanField(model, init_loc_fn=init_to_module(net))
    """
    params = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def init(site):
        name = site["name"]
        matches = [k for k in params if name == k or name.endswith("." + k)]
        if len(matches) > 1:
            matches = [max(matches, key=len)]
        if matches:
            value = params[matches[0]]
            shape = site["fn"].batch_shape + site["fn"].event_shape
            if value.shape != shape:
                raise ValueError(
                    f"init_to_module: parameter {matches[0]!r} has shape {tuple(value.shape)} "
                    f"but site {name!r} has shape {tuple(shape)}"
                )
            # the site's dtype (a float64 model keeps the network's float64 weights exactly)
            return value.to(dist_dtype(site["fn"]) or torch.get_default_dtype())
        if fallback is None:
            raise ValueError(
                f"init_to_module: no parameter of the module matches site {name!r} (module "
                f"parameters: {sorted(params)}); name the layers alike, e.g. build the model "
                "with bayesianize(module), or pass fallback=init_to_fan_in"
            )
        return fallback(site)

    return init

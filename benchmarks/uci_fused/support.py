"""What the fused kernels can train and draw for, and why not where they cannot."""

from __future__ import annotations

from pyro_dropout.guides import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
)

from . import kernels

#: The sample sites of the UCI engine's D-H-1 network, in the kernels' order.
SITES = ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias")
GUIDES = (AutoMeanField, AutoVariationalDropout, AutoDropout, AutoConcreteDropout)
#: The UCI benchmark's guides (``uci_model.GUIDES``) that train on the kernels.
FUSED_GUIDES = ("meanfield", "vd", "dropout", "concrete", "concrete-tau")

_NO_NUMBA = "numba is not installed (pip install 'pyro-dropout[benchmarks]')"


def unsupported_reason(model, guide):
    """Why the fused loss cannot train ``(model, guide)``, or ``None`` when it can."""
    if not kernels.available():
        return _NO_NUMBA
    if type(guide) not in GUIDES:
        return (
            "the fused loss is written for AutoMeanField, AutoVariationalDropout, AutoDropout "
            f"and AutoConcreteDropout, not {type(guide).__name__}"
        )
    if type(guide) is AutoDropout and (guide.learn_scale or isinstance(guide.dropout_rate, dict)):
        return "the fused AutoDropout loss needs a fixed slab scale and one rate for all layers"
    if type(guide) is AutoConcreteDropout and guide.rate_per != "layer":
        return "the fused AutoConcreteDropout loss needs one rate per layer (rate_per='layer')"
    return _network_unsupported(model, "loss")


def supports(model, guide):
    """Whether :func:`~benchmarks.uci_fused.fused_loss` can train ``(model, guide)``."""
    return unsupported_reason(model, guide) is None


def predict_unsupported_reason(model):
    """Why :class:`~benchmarks.uci_fused.FusedDraw` cannot draw for ``model``, or
    ``None`` when it can (any guide: it draws the weights by tracing the guide)."""
    if not kernels.available():
        return _NO_NUMBA
    return _network_unsupported(model, "draw")


def predict_supports(model):
    """Whether :class:`~benchmarks.uci_fused.FusedDraw` can draw for ``model``."""
    return predict_unsupported_reason(model) is None


def _network_unsupported(model, what):
    if getattr(model, "heteroscedastic", True):
        return f"the fused {what} has one output (no heteroscedastic head)"
    if len(model.layers) != 2:
        return (
            f"the fused {what} is written for D-H-1 networks (one hidden layer), not "
            f"{len(model.layers) - 1} hidden layers: use the traced Pyro loss (kernels=None "
            "picks it)"
        )
    if model.layers[1].out_features != 1:
        return f"the fused {what} is written for D-H-1 networks"
    return None

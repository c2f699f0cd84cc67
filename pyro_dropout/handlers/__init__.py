"""Pyro effect handlers: local reparameterisation of Bayesian layers and of the linear and
convolution operations of any Pyro model."""

from ..nn.guided_value import GuidedValue
from .lrt_messenger import (
    ESTIMATORS,
    LocalReparameterizationMessenger,
    LocalReparameterizationWarning,
    local_reparameterization,
    weight_draws,
)
from .registry import lookup_rule, register_local_reparameterization
from .vector_weight_rule import __all__ as _  # noqa: F401 - registers the VectorWeight rule

__all__ = [
    "ESTIMATORS",
    "GuidedValue",
    "LocalReparameterizationMessenger",
    "LocalReparameterizationWarning",
    "local_reparameterization",
    "lookup_rule",
    "register_local_reparameterization",
    "weight_draws",
]

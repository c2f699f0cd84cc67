"""Pyro effect handlers: local reparameterisation of Bayesian layers."""

from .lrt_messenger import LocalReparameterizationMessenger, local_reparameterization
from .registry import lookup_rule, register_local_reparameterization

__all__ = [
    "LocalReparameterizationMessenger",
    "local_reparameterization",
    "lookup_rule",
    "register_local_reparameterization",
]

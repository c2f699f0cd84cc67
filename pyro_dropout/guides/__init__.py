"""Guides that emit their variational family at each weight site: MC dropout, Concrete
dropout (learned drop rates), mean-field Gaussian (Bayes by Backprop) and variational dropout
with learned α."""

from .base import AutoWeightGuide
from .concrete_dropout import AutoConcreteDropout
from .dropout import AutoDropout
from .init import init_to_fan_in, init_to_glorot, init_to_module
from .mean_field import AutoMeanField
from .variational_dropout import LOG_ALPHA_CLIP, AutoVariationalDropout, SparsityReport

__all__ = [
    "AutoConcreteDropout",
    "AutoDropout",
    "AutoMeanField",
    "AutoVariationalDropout",
    "AutoWeightGuide",
    "LOG_ALPHA_CLIP",
    "SparsityReport",
    "init_to_fan_in",
    "init_to_glorot",
    "init_to_module",
]

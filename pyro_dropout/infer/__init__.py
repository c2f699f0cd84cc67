"""Fitting (plain Pyro SVI) and Monte-Carlo prediction."""

from .elbo import MeanFieldELBO
from .fit import fit
from .predict import Prediction, predict
from .tau import gal_tau, gal_weight_decay, prior_scale_from_length_scale

__all__ = [
    "MeanFieldELBO",
    "Prediction",
    "fit",
    "gal_tau",
    "gal_weight_decay",
    "predict",
    "prior_scale_from_length_scale",
]

"""Fitting (plain Pyro SVI) and Monte-Carlo prediction."""

from .compiled import CompilationWarning, JitMeanFieldELBO
from .compiled_svi import CompiledSVI
from .fit import fit
from .mean_field_elbo import MeanFieldELBO
from .optim import FusedOptim, fused_adam
from .predict import Prediction, predict
from .tau import gal_tau, gal_weight_decay, prior_scale_from_length_scale

__all__ = [
    "CompilationWarning",
    "CompiledSVI",
    "JitMeanFieldELBO",
    "FusedOptim",
    "MeanFieldELBO",
    "Prediction",
    "fit",
    "fused_adam",
    "gal_tau",
    "gal_weight_decay",
    "predict",
    "prior_scale_from_length_scale",
]

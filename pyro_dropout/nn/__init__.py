"""Bayesian layers and models whose weights are Pyro sample sites."""

from .convert import bayesianize
from .functional import ConvSpec, LinearSpec, bayesian_layer
from .layers import BayesianConv1d, BayesianConv2d, BayesianLinear
from .likelihoods import (
    CategoricalLikelihood,
    GaussianLikelihood,
    HeteroscedasticGaussianLikelihood,
)
from .models import BayesianConvNet, BayesianMLP, BayesianModel, make_likelihood
from .priors import HyperPrior, LearnedPrior, make_prior

__all__ = [
    "BayesianConv1d",
    "BayesianConv2d",
    "BayesianConvNet",
    "BayesianLinear",
    "BayesianMLP",
    "BayesianModel",
    "CategoricalLikelihood",
    "ConvSpec",
    "GaussianLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "HyperPrior",
    "LearnedPrior",
    "LinearSpec",
    "bayesian_layer",
    "bayesianize",
    "make_likelihood",
    "make_prior",
]

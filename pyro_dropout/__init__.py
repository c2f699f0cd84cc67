"""pyro-dropout: dropout as a first-class variational family for Pyro.

One Bayesian network, four interchangeable guides (MC dropout, Concrete dropout with learned
drop rates, mean-field Gaussian, variational dropout with learned α), all trained with local
reparameterisation, compared through ArviZ.
"""

from ._version import __version__
from .distributions import BernoulliMaskedNormal, ConcreteMaskedNormal, ImproperLogUniform
from .guides import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    init_to_fan_in,
    init_to_module,
)
from .handlers import (
    local_reparameterization,
    register_local_reparameterization,
    weight_draws,
)
from .infer import Prediction, fit, gal_tau, gal_weight_decay, predict
from .nn import (
    BayesianConv1d,
    BayesianConv2d,
    BayesianConvNet,
    BayesianLinear,
    BayesianMLP,
    BayesianModel,
    HeteroscedasticGaussianLikelihood,
    HyperPrior,
    LearnedPrior,
    bayesianize,
)

# The ArviZ layer is imported on first use: ArviZ is a heavy import (and 0.23 prints a
# FutureWarning), and fitting does not need it.
_DIAGNOSTICS = ("to_inference_data", "compare", "simulation_based_calibration")


def __getattr__(name):
    if name in _DIAGNOSTICS:
        from . import diagnostics

        return getattr(diagnostics, name)
    raise AttributeError(f"module 'pyro_dropout' has no attribute {name!r}")


__all__ = [
    "AutoConcreteDropout",
    "AutoDropout",
    "AutoMeanField",
    "AutoVariationalDropout",
    "BayesianConv1d",
    "BayesianConv2d",
    "BayesianConvNet",
    "BayesianLinear",
    "BayesianMLP",
    "BayesianModel",
    "BernoulliMaskedNormal",
    "ConcreteMaskedNormal",
    "HeteroscedasticGaussianLikelihood",
    "HyperPrior",
    "ImproperLogUniform",
    "LearnedPrior",
    "Prediction",
    "__version__",
    "bayesianize",
    "compare",
    "fit",
    "gal_tau",
    "gal_weight_decay",
    "init_to_fan_in",
    "init_to_module",
    "local_reparameterization",
    "predict",
    "register_local_reparameterization",
    "simulation_based_calibration",
    "to_inference_data",
    "weight_draws",
]

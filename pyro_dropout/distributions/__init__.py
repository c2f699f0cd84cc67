"""Probability layer: the dropout variational families (fixed and learned rates), the
log-uniform prior and their KLs."""

from . import kl
from .bernoulli_masked_normal import BernoulliMaskedNormal
from .concrete_masked_normal import ConcreteMaskedNormal, RelaxedDensityError, concrete_keep_mask
from .empirical_bayes import EmpiricalBayesScale
from .improper_log_uniform import ImproperLogUniform
from .kl import (
    kl_bernoulli_masked_normal_normal,
    kl_concrete_masked_normal_normal,
    kl_lognormal_gamma,
    kl_normal_log_uniform,
    kl_normal_normal,
    neg_kl_log_uniform_kingma,
    neg_kl_log_uniform_molchanov,
    set_log_uniform_kl,
)
from .log_alpha_normal import LogAlphaNormal

__all__ = [
    "BernoulliMaskedNormal",
    "ConcreteMaskedNormal",
    "EmpiricalBayesScale",
    "ImproperLogUniform",
    "LogAlphaNormal",
    "RelaxedDensityError",
    "kl",
    "concrete_keep_mask",
    "kl_bernoulli_masked_normal_normal",
    "kl_concrete_masked_normal_normal",
    "kl_lognormal_gamma",
    "kl_normal_log_uniform",
    "kl_normal_normal",
    "neg_kl_log_uniform_kingma",
    "neg_kl_log_uniform_molchanov",
    "set_log_uniform_kl",
]

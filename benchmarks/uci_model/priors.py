"""The priors and noise settings of the UCI model and the dropout guide's training precision."""

#: Prior length-scale l of the UCI protocol.
LENGTH_SCALE = 1e-2
#: Slab scale σ of :class:`~pyro_dropout.AutoDropout` (Gal's Keras net is the σ → 0 limit).
DROPOUT_SLAB_SCALE = 1e-4
#: Prior scale of the biases under the dropout guide: effectively flat (Keras' Dense layers in
#: the reference net regularise the weights only).
DROPOUT_BIAS_PRIOR_SCALE = 1e6
#: Prior scale of the biases under the VD guide (standardised data); its weights get the
#: log-uniform prior, biases are not sparsified (Molchanov et al. 2017 keep them deterministic).
VD_BIAS_PRIOR_SCALE = 1.0
#: Initial noise SD (standardised scale) of members that learn their noise precision.
INIT_NOISE_SD = 0.1
#: Floor of the heteroscedastic members' noise scale (standardised targets).
HETERO_MIN_SCALE = 1e-3
#: Prior scales (standardised data) searched for the mean-field guide.
MEANFIELD_PRIOR_SCALES = (0.3, 1.0, 3.0)


def dropout_training_precision(tau, dropout_rate):
    r"""Likelihood precision τ' on the standardised targets that makes our ELBO, with prior
    ``Normal(0, 1/l)`` on the weights, equal to the reference Keras objective up to a constant
    factor: :math:`τ' = 2τ/(1-p)^2` (derivation in
    :mod:`benchmarks.uci.protocol`)."""
    return 2.0 * tau / (1.0 - dropout_rate) ** 2

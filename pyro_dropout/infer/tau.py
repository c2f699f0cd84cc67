"""Gal & Ghahramani's relation between the model precision τ, the prior length-scale and
dropout's weight decay."""

__all__ = ["gal_tau", "gal_weight_decay", "prior_scale_from_length_scale"]


def gal_tau(length_scale: float, dropout_rate: float, num_data: int, weight_decay: float) -> float:
    r"""Model precision :math:`τ = \frac{(1-p)\,l^2}{2 N λ}` (Gal & Ghahramani 2016, eq. 7).

    :param length_scale: prior length-scale :math:`l` (prior :math:`\mathcal N(0, l^{-2})`).
    :param dropout_rate: drop probability :math:`p`.
    :param num_data: number of training points :math:`N`.
    :param weight_decay: L2 coefficient :math:`λ` of standard dropout training.
    """
    _check(length_scale, dropout_rate, num_data)
    if not weight_decay > 0:
        raise ValueError(f"weight_decay must be positive, got {weight_decay}")
    return (1 - dropout_rate) * length_scale**2 / (2 * num_data * weight_decay)


def gal_weight_decay(length_scale: float, dropout_rate: float, num_data: int, tau: float) -> float:
    r"""Weight decay :math:`λ = \frac{(1-p)\,l^2}{2 N τ}` matching a prior length-scale and τ
    (the inverse of :func:`gal_tau`; the UCI protocol's formula).

    This is the decay of the *weights*, whose columns are dropped with probability p. Biases
    are never dropped, so their matching decay is :math:`l^2 / (2Nτ) = λ / (1-p)`."""
    _check(length_scale, dropout_rate, num_data)
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return (1 - dropout_rate) * length_scale**2 / (2 * num_data * tau)


def prior_scale_from_length_scale(length_scale: float) -> float:
    """Standard deviation :math:`1/l` of the Normal prior with length-scale :math:`l`."""
    if not length_scale > 0:
        raise ValueError(f"length_scale must be positive, got {length_scale}")
    return 1.0 / length_scale


def _check(length_scale, dropout_rate, num_data):
    if not length_scale > 0:
        raise ValueError(f"length_scale must be positive, got {length_scale}")
    if not 0 <= dropout_rate < 1:
        raise ValueError(f"dropout_rate must lie in [0, 1), got {dropout_rate}")
    if not num_data >= 1:
        raise ValueError(f"num_data must be at least 1, got {num_data}")

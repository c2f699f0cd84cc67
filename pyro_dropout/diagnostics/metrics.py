"""Held-out predictive metrics on plain numpy arrays (no Pyro, no ArviZ).

Conventions: ``log_lik`` has shape ``(S, N)`` (draws first); predictive draws have shape
``(S, N, ...)``; class probabilities have shape ``(N, K)``; labels are integers in ``[0, K)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "accuracy",
    "brier_score",
    "coverage_table",
    "expected_calibration_error",
    "interval_coverage",
    "log_mean_exp",
    "lppd",
    "mean_lpd",
    "pit",
    "reliability_curve",
    "rmse",
]


def log_mean_exp(a: np.ndarray, axis: int = 0) -> np.ndarray:
    r"""Numerically stable :math:`\log \frac{1}{S}\sum_s e^{a_s}` along ``axis``.

    Example:
        >>> round(float(log_mean_exp(np.log([1.0, 3.0]))), 6)  # log 2
        0.693147
    """
    a = np.asarray(a, dtype=float)
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):  # all -inf: the answer is -inf
        out = np.log(np.mean(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis)


def lppd(log_lik: np.ndarray) -> np.ndarray:
    r"""Pointwise log predictive density of each observation, Monte Carlo over posterior draws.

    .. math:: \mathrm{lpd}_i = \log \frac{1}{S} \sum_{s=1}^S p(y_i \mid \theta_s),
              \qquad \theta_s \sim q(\theta)

    computed with log-sum-exp (Gelman, Hwang & Vehtari 2014, "Understanding predictive
    information criteria for Bayesian models", Stat. Comput. 24).

    Args:
        log_lik: ``(S, N)`` pointwise log-likelihoods ``log p(y_i | theta_s)``.

    Returns:
        ``(N,)`` array.

    Example:
        >>> lppd(np.log([[0.5, 0.1], [0.3, 0.1]]))  # log(0.4), log(0.1)
        array([-0.91629073, -2.30258509])
    """
    log_lik = np.asarray(log_lik, dtype=float)
    if log_lik.ndim != 2:
        raise ValueError(f"log_lik must have shape (S, N); got {log_lik.shape}")
    return log_mean_exp(log_lik, axis=0)


def mean_lpd(log_lik: np.ndarray) -> float:
    """Mean over points of :func:`lppd`: the test log predictive density per point (nats).

    Example:
        >>> round(mean_lpd(np.log([[0.5, 0.1], [0.3, 0.1]])), 4)
        -1.6094
    """
    return float(np.mean(lppd(log_lik)))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    r"""Root mean squared error :math:`\sqrt{\frac{1}{n}\sum_j (y_j - \hat y_j)^2}` over all entries.

    Example:
        >>> rmse(np.array([0.0, 0.0]), np.array([3.0, 4.0]))  # sqrt((9 + 16) / 2)
        3.5355339059327378
    """
    y_true = np.asarray(y_true, dtype=float)
    y_pred = np.asarray(y_pred, dtype=float)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"shape mismatch: y_true {y_true.shape} vs y_pred {y_pred.shape}")
    return float(np.sqrt(np.mean((y_true - y_pred) ** 2)))


def _check_draws(y_true: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true, dtype=float)
    draws = np.asarray(draws, dtype=float)
    if draws.shape[1:] != y_true.shape:
        raise ValueError(
            f"draws must have shape (S, *y_true.shape) = (S, {y_true.shape}); got {draws.shape}"
        )
    return y_true, draws


def interval_coverage(y_true: np.ndarray, draws: np.ndarray, prob: float) -> float:
    r"""Fraction of observations inside the central ``prob`` predictive interval.

    The interval of entry :math:`j` is :math:`[Q_j((1-p)/2), Q_j((1+p)/2)]`, with :math:`Q_j`
    the empirical quantile function of the predictive draws of that entry. A calibrated
    predictive distribution gives a coverage close to ``prob``.

    Args:
        y_true: observed values, any shape.
        draws: ``(S, *y_true.shape)`` posterior predictive draws.
        prob: nominal coverage in (0, 1).

    Example:
        >>> d = np.arange(101.0)[:, None] * np.ones((1, 4))   # draws 0..100 for 4 points
        >>> interval_coverage(np.array([10.0, 50.0, 80.0, 99.0]), d, 0.9)  # [5, 95]
        0.75
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1); got {prob}")
    y_true, draws = _check_draws(y_true, draws)
    lo, hi = np.quantile(draws, [(1 - prob) / 2, (1 + prob) / 2], axis=0)
    return float(np.mean((y_true >= lo) & (y_true <= hi)))


def pit(y_true: np.ndarray, draws: np.ndarray) -> np.ndarray:
    r"""Probability integral transform :math:`u_j = \frac{1}{S}\sum_s 1[\tilde y_{s,j} \le y_j]`.

    For a calibrated continuous predictive distribution the :math:`u_j` are uniform on [0, 1]
    (Dawid 1984; Gneiting, Balabdaoui & Raftery 2007). Returned flattened.

    Example:
        >>> pit(np.array([0.5]), np.array([[0.0], [1.0], [0.2], [0.9]]))
        array([0.5])
    """
    y_true, draws = _check_draws(y_true, draws)
    return np.mean(draws <= y_true[None], axis=0).ravel()


def _check_probs(y_true: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=float)
    y = np.asarray(y_true)
    if probs.ndim != 2 or y.shape != probs.shape[:1]:
        raise ValueError(
            f"need labels of shape (N,) and probs of shape (N, K); got {y.shape}, {probs.shape}"
        )
    y_int = y.astype(int)
    if np.any(y_int != y) or np.any(y_int < 0) or np.any(y_int >= probs.shape[1]):
        raise ValueError(f"labels must be integers in [0, {probs.shape[1]})")
    return y_int, probs


def accuracy(y_true: np.ndarray, probs: np.ndarray) -> float:
    """Fraction of points whose most probable class is the label.

    Example:
        >>> accuracy(np.array([0, 1]), np.array([[0.8, 0.2], [0.6, 0.4]]))
        0.5
    """
    y, probs = _check_probs(y_true, probs)
    return float(np.mean(np.argmax(probs, axis=1) == y))


def brier_score(y_true: np.ndarray, probs: np.ndarray) -> float:
    r"""Multi-class Brier score :math:`\frac{1}{N}\sum_i \sum_k (p_{ik} - 1[y_i = k])^2`.

    Brier (1950), "Verification of forecasts expressed in terms of probability"; 0 is perfect,
    2 the worst. For two classes this is twice the binary Brier score.

    Example:
        >>> round(brier_score(np.array([0]), np.array([[0.8, 0.2]])), 6)  # 0.2^2 + 0.2^2
        0.08
    """
    y, probs = _check_probs(y_true, probs)
    onehot = np.eye(probs.shape[1])[y]
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def reliability_curve(
    y_true: np.ndarray, probs: np.ndarray, n_bins: int = 10
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin mean confidence, accuracy and count of the top-class predictions.

    Confidence is :math:`\\max_k p_{ik}`; bins are ``n_bins`` equal-width intervals of [0, 1]
    (the first closed, the others left-open). Empty bins give NaN confidence/accuracy.

    Returns:
        ``(confidence, accuracy, count)``, each of shape ``(n_bins,)``.

    Example:
        >>> probs = np.array([[0.9, 0.1], [0.9, 0.1]])
        >>> conf, acc, n = reliability_curve(np.array([0, 1]), probs, 2)
        >>> float(conf[1]), float(acc[1]), n.tolist()
        (0.9, 0.5, [0, 2])
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1; got {n_bins}")
    y, probs = _check_probs(y_true, probs)
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y).astype(float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.searchsorted(edges[1:-1], conf, side="left")  # bin b holds (edge_b, edge_b+1]
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=n_bins) / count
        mean_acc = np.bincount(idx, weights=correct, minlength=n_bins) / count
    return mean_conf, mean_acc, count


def expected_calibration_error(y_true: np.ndarray, probs: np.ndarray, n_bins: int = 10) -> float:
    r"""Expected calibration error of the top-class confidence.

    .. math:: \mathrm{ECE} = \sum_{b=1}^{B} \frac{|B_b|}{N}\,
              \bigl|\mathrm{acc}(B_b) - \mathrm{conf}(B_b)\bigr|

    with the equal-width bins of :func:`reliability_curve` (Naeini, Cooper & Hauskrecht 2015;
    Guo et al. 2017, "On Calibration of Modern Neural Networks").

    Example:
        >>> expected_calibration_error(np.array([0, 1]), np.array([[0.9, 0.1], [0.9, 0.1]]), 2)
        0.4
    """
    conf, acc, count = reliability_curve(y_true, probs, n_bins)
    keep = count > 0
    return float(np.sum(count[keep] / count.sum() * np.abs(acc[keep] - conf[keep])))


def coverage_table(
    y_true: np.ndarray, draws: np.ndarray, probs: Sequence[float] = (0.5, 0.9, 0.95)
) -> dict[float, float]:
    """:func:`interval_coverage` at several nominal levels, as ``{prob: coverage}``.

    Example:
        >>> d = np.arange(101.0)[:, None] * np.ones((1, 2))
        >>> coverage_table(np.array([50.0, 99.0]), d, (0.5, 0.99))
        {0.5: 0.5, 0.99: 1.0}
    """
    return {float(p): interval_coverage(y_true, draws, p) for p in probs}

"""Monte-Carlo comparison helpers: two-sample z-scores for means, variances and covariances.

Every check compares sample moments over the leading (draw) dimension, element by element, and
fails when ``|z| > Z`` for any element. ``Z = 5`` keeps the family-wise false-alarm rate of a
test with ``E`` compared elements below ``E · 5.7e-7`` (two-sided normal tail at 5), i.e. under
1e-3 for the few hundred elements compared here; all tests are seeded on top of that.
"""

import math

import torch

#: z threshold used throughout (see module docstring).
Z = 5.0


def mean_and_se(a):
    """Sample mean over dim 0 and its standard error."""
    a = a.double()
    n = a.shape[0]
    return a.mean(0), a.std(0) / math.sqrt(n)


def var_and_se(a):
    """Sample variance over dim 0 and its standard error ``sqrt((m4 - s^4) / n)`` (the
    large-sample variance of a sample variance, valid for non-Gaussian draws via the empirical
    fourth central moment ``m4``)."""
    a = a.double()
    n = a.shape[0]
    c = a - a.mean(0)
    s2 = (c * c).mean(0)
    m4 = (c**4).mean(0)
    return s2 * n / (n - 1), ((m4 - s2 * s2).clamp_min(0) / n).sqrt()


def mean_z(a, b):
    """Element-wise z-scores of the difference of the means of independent samples ``a``, ``b``."""
    ma, sa = mean_and_se(a)
    mb, sb = mean_and_se(b)
    return (ma - mb) / (sa**2 + sb**2).sqrt().clamp_min(1e-300)


def var_z(a, b):
    """Element-wise z-scores of the difference of the variances of independent samples."""
    va, sa = var_and_se(a)
    vb, sb = var_and_se(b)
    return (va - vb) / (sa**2 + sb**2).sqrt().clamp_min(1e-300)


def cov_products(a):
    """Per-draw products of centred components ``(a_j - ā_j)(a_k - ā_k)`` over the last dim."""
    a = a.double()
    c = a - a.mean(0)
    return c.unsqueeze(-1) * c.unsqueeze(-2)


def cov_z(a, b):
    """z-scores of the difference of the covariance matrices (over the last dim) of ``a``, ``b``.

    The covariance is the mean of the centred products, so its SE is that of a mean.
    """
    return mean_z(cov_products(a), cov_products(b))


def one_sample_z(a, expected):
    """z-scores of the sample mean of ``a`` against an exact ``expected`` value."""
    m, s = mean_and_se(a)
    return (m - expected.double()) / s.clamp_min(1e-300)


def one_sample_var_z(a, expected):
    """z-scores of the sample variance of ``a`` against an exact ``expected`` variance."""
    v, s = var_and_se(a)
    return (v - expected.double()) / s.clamp_min(1e-300)


def log_var_ratio_z(a, b):
    """z-score of ``log(var(a) / var(b))`` for scalar samples ``a``, ``b`` (shape ``(n,)``).

    Delta method: ``Var(log s²) ≈ (κ - 1) / n`` with κ the (empirical) kurtosis ``m4 / s⁴``.
    """
    out = []
    for x in (a, b):
        x = x.double()
        n = x.shape[0]
        c = x - x.mean()
        s2 = (c * c).mean()
        kurt = (c**4).mean() / (s2 * s2)
        out.append((torch.log(s2), (kurt - 1) / n))
    (la, va), (lb, vb) = out
    return float((la - lb) / (va + vb).sqrt())


def max_abs(z):
    return float(z.abs().max())

r"""The Gaussian likelihood term of the loss and its derivatives, shared by the autograd loss
and the hand-written gradients."""

from __future__ import annotations

import math

import torch


def scaled_log_likelihood(model, f, y, num_data):
    r"""``(N / B) Σ log N(y | f, s_m²)``: the minibatch's log-likelihood on the full-data
    scale, as the model's ``data`` plate scales it; also the standardised residuals
    :math:`z = (y - f) / s` and the noise SDs ``s`` ``(M, 1)``, which its derivatives need
    (:func:`likelihood_gradients`)."""
    members, batch = f.shape
    sd = model.noise_sd().reshape(members, 1)
    z = (y - f) / sd
    log_lik = -0.5 * (z * z).sum() - batch * torch.log(sd).sum()
    log_lik = log_lik - 0.5 * math.log(2 * math.pi) * members * batch
    return _scale(num_data, batch) * log_lik, z, sd


def likelihood_gradients(z, sd, num_data):
    r"""The derivatives of the negative scaled log-likelihood: to ``f``,
    :math:`(N / B)(f - y) / s^2 = -(N / B)\, z / s`, and to each member's noise SD,
    :math:`(N / B) \sum_i (1 - z_i^2) / s` ``(M, 1)``."""
    scale = _scale(num_data, z.shape[1])
    return scale * (-z / sd), scale * ((1 - z * z) / sd).sum(-1, keepdim=True)


def _scale(num_data, batch):
    n = batch if num_data is None else int(num_data)
    return n / batch

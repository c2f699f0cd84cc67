"""Model and guide of the members of each guide, heteroscedastic ones included."""

from __future__ import annotations

import itertools
import math

import torch

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    ImproperLogUniform,
)
from pyro_dropout.guides import init_to_glorot

from .configs import GUIDES, HETERO_BASE
from .members import Members
from .network import BatchedRegressionMLP
from .priors import (
    DROPOUT_BIAS_PRIOR_SCALE,
    DROPOUT_SLAB_SCALE,
    LENGTH_SCALE,
    VD_BIAS_PRIOR_SCALE,
    dropout_training_precision,
)

#: Each batched guide of a process gets its own name in Pyro's param store: several are alive at
#: once (validation and final phases, the hetero configurations), and a guide's default name is
#: its class name (pyro_dropout.guides.store_names).
_GUIDE_NUMBERS = itertools.count()


def _guide_name(kind):
    return f"uci_{kind}_{next(_GUIDE_NUMBERS)}"


def build(guide, d_in, n_hidden, members: Members, hidden_layers=1):
    """Model and guide for ``members`` (each member's configuration from :func:`grid`), a
    network of ``hidden_layers`` hidden layers of ``n_hidden`` units.

    Returns ``(model, guide, eval_tau)`` where ``eval_tau()`` gives the ``(M,)`` float64
    precisions on the original target scale used for the test log-likelihood (for learned
    noise: the learned precision mapped back with the member's target SD).
    """
    cfg = members.configs
    dtype = torch.get_default_dtype()
    y_var = members.y_std**2
    if guide in HETERO_BASE:
        return _build_hetero(guide, d_in, n_hidden, members, hidden_layers)
    if guide == "dropout":
        rate = torch.tensor([c["dropout_rate"] for c in cfg], dtype=torch.float64)
        tau = torch.tensor([c["tau"] for c in cfg], dtype=torch.float64)
        noise_sd = dropout_training_precision(tau, rate) ** -0.5
        model = BatchedRegressionMLP(
            d_in,
            n_hidden,
            noise_sd.to(dtype),
            weight_prior=1.0 / LENGTH_SCALE,
            bias_prior=DROPOUT_BIAS_PRIOR_SCALE,
            hidden_layers=hidden_layers,
        )
        g = AutoDropout(
            model,
            dropout_rate=rate.to(dtype).reshape(-1, 1, 1, 1),
            input_dropout_rate=rate.to(dtype).reshape(-1, 1, 1, 1),  # Gal's: inputs too
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("dropout"),
        )
        return model, g, lambda: tau.clone()

    noise = [c["noise"] for c in cfg]
    fixed_tau = torch.tensor([math.nan if n == "learned" else float(n) for n in noise]).double()
    noise_sd = (fixed_tau * y_var) ** -0.5  # NaN stays NaN: learned
    if guide == "meanfield":
        prior = torch.tensor([c["prior_scale"] for c in cfg], dtype=dtype)
        model = BatchedRegressionMLP(
            d_in, n_hidden, noise_sd.to(dtype), prior, prior, hidden_layers=hidden_layers
        )
        g = AutoMeanField(model, init_loc_fn=init_to_glorot, name=_guide_name("meanfield"))
    elif guide in ("concrete", "concrete-tau"):
        model = BatchedRegressionMLP(
            d_in,
            n_hidden,
            noise_sd.to(dtype),
            weight_prior=1.0 / LENGTH_SCALE,
            bias_prior=DROPOUT_BIAS_PRIOR_SCALE,
            hidden_layers=hidden_layers,
        )
        g = AutoConcreteDropout(
            model,
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("concrete"),
        )
    elif guide == "vd":
        model = BatchedRegressionMLP(
            d_in,
            n_hidden,
            noise_sd.to(dtype),
            ImproperLogUniform(),
            VD_BIAS_PRIOR_SCALE,
            hidden_layers=hidden_layers,
        )
        g = AutoVariationalDropout(
            model, alpha="weight", init_loc_fn=init_to_glorot, name=_guide_name("vd")
        )
    else:
        raise ValueError(f"unknown guide {guide!r}; valid names are: {', '.join(GUIDES)}")

    def eval_tau():
        sd = model.noise_sd().detach().double().reshape(-1).to(y_var.device)
        return 1.0 / (sd**2 * y_var)

    return model, g, eval_tau


def _build_hetero(guide, d_in, n_hidden, members, hidden_layers=1):
    """The "<guide>-hetero" members: heteroscedastic outputs and a learned prior scale per
    layer on the weights (:class:`~pyro_dropout.nn.LearnedPrior`); ``eval_tau`` gives NaN
    before evaluation (the test LL uses each draw's predicted scale, and the recorded τ is
    :func:`evaluate`'s summary of the predicted noise)."""
    cfg = members.configs
    dtype = torch.get_default_dtype()
    m = len(cfg)
    base = HETERO_BASE[guide]
    fixed_slab = base in ("dropout", "concrete")
    bias = DROPOUT_BIAS_PRIOR_SCALE if fixed_slab else VD_BIAS_PRIOR_SCALE
    # The MC-dropout families keep their base guide's fixed prior N(0, 1/l). With the posterior
    # SD fixed at the slab σ = 1e-4, a learned per-layer scale profiles the KL to
    # (K/2) log mean(E_q[w²]) per layer; rescaling the ReLU layers (first × c, second × 1/c)
    # leaves the function alone and lowers that KL by (K1 - K2) log(1/c) (K1 = 8·50 > K2 = 50·2)
    # until the first layer's weights reach σ: about 2300 nats to gain (weights of SD 0.3) by
    # shrinking it to the slab's noise floor. The Gaussian families learn their posterior SDs,
    # so their profiled KL does not change under that rescaling.
    weight_prior = 1.0 / LENGTH_SCALE if fixed_slab else "learned"
    model = BatchedRegressionMLP(
        d_in,
        n_hidden,
        torch.ones(m, dtype=dtype),
        weight_prior,
        bias,
        heteroscedastic=True,
        hidden_layers=hidden_layers,
    )
    if base == "dropout":
        rate = torch.tensor([c["dropout_rate"] for c in cfg], dtype=dtype)
        g = AutoDropout(
            model,
            dropout_rate=rate.reshape(-1, 1, 1, 1),
            input_dropout_rate=rate.reshape(-1, 1, 1, 1),  # as the homoscedastic members
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("dropout"),
        )
    elif base == "concrete":
        g = AutoConcreteDropout(
            model,
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("concrete"),
        )
    elif base == "meanfield":
        g = AutoMeanField(model, init_loc_fn=init_to_glorot, name=_guide_name("meanfield"))
    else:
        g = AutoVariationalDropout(
            model, alpha="weight", init_loc_fn=init_to_glorot, name=_guide_name("vd")
        )
    return model, g, lambda: torch.full((m,), math.nan, dtype=torch.float64)

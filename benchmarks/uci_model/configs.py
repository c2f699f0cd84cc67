"""The guides of the benchmark (what each is and its hyper-parameters) and their grids."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .priors import MEANFIELD_PRIOR_SCALES


@dataclass(frozen=True)
class GuideSpec:
    """What the benchmark needs to know about one guide: its grid and how to build it."""

    name: str
    family: str
    description: str
    hyperparameters: tuple[str, ...]
    #: Learned noise in both phases; the validation LL picks a factor on the learned precision
    #: (:data:`TAU_CALIBRATION_FACTORS`) that the final fit's test LL applies to its own.
    calibrate_noise: bool = False


GUIDES = {
    "dropout": GuideSpec(
        "dropout",
        "AutoDropout",
        "MC dropout (Gal & Ghahramani 2016): dropout rate p x model precision tau from the "
        "dataset's grids, the reference net's objective (weight decay l^2(1-p)/(2 N tau), "
        "l = 0.01), test LL with the grid tau",
        ("dropout_rate", "tau"),
    ),
    "meanfield": GuideSpec(
        "meanfield",
        "AutoMeanField",
        "Bayes by Backprop (mean-field Gaussian): prior scale s in {0.3, 1, 3} (Normal(0, s^2) "
        "on all weights and biases, standardised data) x noise precision in {the dataset's tau "
        "grid, learned (point estimate maximising the ELBO)}",
        ("prior_scale", "noise"),
    ),
    "vd": GuideSpec(
        "vd",
        "AutoVariationalDropout",
        "Sparse variational dropout (one learned alpha per weight, log-uniform prior, Molchanov "
        "KL; biases Normal(0, 1)): noise precision in {the dataset's tau grid, learned (point "
        "estimate maximising the ELBO)}",
        ("noise",),
    ),
    "concrete": GuideSpec(
        "concrete",
        "AutoConcreteDropout",
        "Concrete dropout (Gal, Hron & Kendall 2017): one drop rate per layer learned by "
        "gradient (init 0.1, temperature 0.1), prior Normal(0, 1/l) on the weights (l = 0.01, "
        "biases flat, as the dropout guide), noise precision learned (point estimate "
        "maximising the ELBO); no grid, so no validation phase",
        (),
    ),
    "concrete-tau": GuideSpec(
        "concrete-tau",
        "AutoConcreteDropout",
        "Concrete dropout as `concrete` (drop rates and noise learned), with the test-time tau "
        "calibrated on the validation rows: the training on the sub-training rows picks the "
        "factor f in 10^[-2, 2] (81 values) on its learned precision with the best validation "
        "LL; the final fit's test LL uses f times its own learned precision",
        ("noise",),
        calibrate_noise=True,
    ),
}

#: Base guide of each "<guide>-hetero" configuration (issue 24).
HETERO_BASE = {
    "dropout-hetero": "dropout",
    "concrete-hetero": "concrete",
    "meanfield-hetero": "meanfield",
    "vd-hetero": "vd",
}
_HETERO_LIK = (
    "a heteroscedastic likelihood (the net predicts the mean and a noise scale per row, "
    "softplus with a floor of 1e-3, the scale head as Bayesian as the rest)"
)
_HETERO_TAIL = (
    ", with both of issue 24's ingredients: " + _HETERO_LIK + " and a learned prior scale per "
    "layer on the weights (empirical Bayes: the closed-form optimum mean E_q[w^2] emitted by "
    "the guide); no tau grid, the test LL is the mixture over draws of the predicted Gaussians"
)
#: The MC-dropout families: the likelihood only (see _build_hetero for why not the prior).
_HETERO_TAIL_FIXED = (
    ", with " + _HETERO_LIK + " and the base guide's fixed prior N(0, 1/l) (l = 0.01): a "
    "learned prior scale under a fixed posterior SD is ill-posed (the first layer shrinks to "
    "the slab); no tau grid, the test LL is the mixture over draws of the predicted Gaussians"
)
GUIDES.update(
    {
        "dropout-hetero": GuideSpec(
            "dropout-hetero",
            "AutoDropout",
            "MC dropout (slab 1e-4, flat biases) with the dataset's dropout-rate grid chosen "
            "by validation LL" + _HETERO_TAIL_FIXED,
            ("dropout_rate",),
        ),
        "concrete-hetero": GuideSpec(
            "concrete-hetero",
            "AutoConcreteDropout",
            "Concrete dropout (one rate per layer learned, slab 1e-4, flat biases; no grid, "
            "no validation phase)" + _HETERO_TAIL_FIXED,
            (),
        ),
        "meanfield-hetero": GuideSpec(
            "meanfield-hetero",
            "AutoMeanField",
            "Bayes by Backprop (biases Normal(0, 1); no grid, no validation phase)" + _HETERO_TAIL,
            (),
        ),
        "vd-hetero": GuideSpec(
            "vd-hetero",
            "AutoVariationalDropout",
            "Variational dropout, one alpha per weight, with a Normal prior (learned scale) "
            "in place of the log-uniform one (biases Normal(0, 1); no grid, no validation "
            "phase)" + _HETERO_TAIL,
            (),
        ),
    }
)

#: Factors on the learned precision scanned when ``concrete-tau`` calibrates the test-time τ on
#: the validation rows (log-spaced, 12 % apart: the validation LL is flat to well under a
#: standard error across one step).
TAU_CALIBRATION_FACTORS = torch.logspace(-2.0, 2.0, 81, dtype=torch.float64)


def grid(guide, dropout_rates, tau_values, quick=False):
    """The hyper-parameter configurations searched for ``guide`` (list of dicts).

    ``noise`` is a τ on the original target scale (a float) or ``"learned"``. The order is the
    reference code's loop order (dropout rate outer, τ inner); ties go to the first.
    ``quick`` keeps the first and last value of each axis (and drops fixed noise levels
    but the last for the Gaussian guides).
    """
    rates, taus = list(dropout_rates), list(tau_values)
    priors = list(MEANFIELD_PRIOR_SCALES)
    if quick:
        rates = sorted({rates[0], rates[-1]}, key=rates.index)
        taus = sorted({taus[0], taus[-1]}, key=taus.index)
        priors = [1.0]
    if guide == "dropout":
        return [{"dropout_rate": p, "tau": t} for p in rates for t in taus]
    if guide == "dropout-hetero":
        return [{"dropout_rate": p, "noise": "heteroscedastic"} for p in rates]
    if guide in HETERO_BASE:
        return [{"noise": "heteroscedastic"}]
    if guide in ("concrete", "concrete-tau"):
        # No grid: the drop rates (and, for "concrete", the noise) are learned, so one
        # training per split; "concrete-tau" calibrates τ on the validation rows after it.
        return [{"noise": "learned"}]
    noise = ([taus[-1]] if quick else taus) + ["learned"]
    if guide == "meanfield":
        return [{"prior_scale": s, "noise": n} for s in priors for n in noise]
    if guide == "vd":
        return [{"noise": n} for n in noise]
    raise ValueError(f"unknown guide {guide!r}; valid names are: {', '.join(GUIDES)}")

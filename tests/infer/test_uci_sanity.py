"""End-to-end sanity check on the UCI Boston housing benchmark, split 0 (PBP/MC-dropout splits).

Each guide is fitted on the standardised training rows (minibatch 128, Adam, local
reparameterisation) and scored on the test rows on the *original* target scale:

* RMSE of the predictive mean mapped back with the training mean/SD of y;
* test log-likelihood: ``Prediction.log_likelihood`` on the standardised targets plus the
  Jacobian of the standardisation, ``LL_orig = LL_std - log(sd_y)``.

Thresholds, from ``shared/data/uci/published_results.md`` (bostonHousing, mean ± SE over 20
splits; SE·√20 gives the spread of a single split):

* RMSE < 4.5. MC dropout (2018 grid search) 2.90 ± 0.18 (single-split SD ≈ 0.8), PBP
  3.01 ± 0.18, mean-field VI 4.32 ± 0.29 (SD ≈ 1.3). 4.5 is above the weakest published
  method's mean and about 2 single-split SDs above dropout's, so one noisy split of a correctly
  working guide passes while a broken fit (predicting the mean: RMSE ≈ 9) fails.
* LL > -3.2. Dropout -2.40 ± 0.04 (SD ≈ 0.19), PBP -2.57 ± 0.09, VI -2.90 ± 0.07 (SD ≈ 0.31):
  -3.2 is one single-split SD below VI's mean and four below dropout's. A Gaussian with the
  marginal SD of y scores about -3.6, so the bound needs a useful predictive distribution.

The budget (400 epochs = 1,600 steps, ~6 s of CPU per guide) is a tenth of Gal's 4,000 epochs;
τ for MC dropout is the middle of the published grid (0.15 on the original scale, i.e.
0.15·sd_y² ≈ 12.7 standardised); the Gaussian guides learn the noise scale.
"""

import math
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    ImproperLogUniform,
    fit,
    predict,
)
from pyro_dropout.datasets import load_uci

UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
RMSE_MAX = 4.5
LL_MIN = -3.2

CONFIGS = {
    # Gal & Ghahramani: dropout 0.05 (inside the published grid), fixed τ from the grid.
    "dropout": dict(
        guide=lambda m: AutoDropout(m, dropout_rate=0.05), prior=1.0, tau_original=0.15
    ),
    # Bayes by backprop with a unit Normal prior on standardised data; learned noise.
    "mean_field": dict(guide=lambda m: AutoMeanField(m), prior=1.0, tau_original=None),
    # Sparse VD: log-uniform prior, per-weight α; learned noise.
    "variational_dropout": dict(
        guide=lambda m: AutoVariationalDropout(m), prior=ImproperLogUniform(), tau_original=None
    ),
}


@pytest.fixture(scope="module")
def boston_split0():
    if not (UCI_DIR / "bostonHousing" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    ds = load_uci("bostonHousing", UCI_DIR)
    return ds, ds.split_arrays(0)


@pytest.fixture
def one_thread():
    """Small matrices: one thread is faster on the 2-core runners and less load-sensitive."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", CONFIGS)
def test_boston_split0_matches_published_range(name, boston_split0):
    ds, split = boston_split0
    cfg = CONFIGS[name]
    sd_y = split.standardizer.y_std
    tau = None if cfg["tau_original"] is None else cfg["tau_original"] * sd_y**2
    pyro.clear_param_store()
    model = BayesianMLP(ds.n_features, 1, hidden=(ds.n_hidden,), tau=tau, prior=cfg["prior"])
    guide = cfg["guide"](model)
    losses = fit(
        model,
        guide,
        split.x_train,
        split.y_train,
        num_epochs=400,
        batch_size=128,
        lr=1e-2,
        progress=False,
        seed=0,
    )
    assert all(math.isfinite(loss) for loss in losses)

    pred = predict(model, guide, split.x_test, num_samples=500, seed=1)
    mean = split.standardizer.inverse_y(pred.mean.squeeze(-1).double().numpy())
    y_test = ds.y[split.test_idx]
    rmse = float(np.sqrt(np.mean((mean - y_test) ** 2)))
    ll = float(pred.log_likelihood(split.y_test).double().mean()) - math.log(sd_y)
    print(f"\nboston split 0, {name}: RMSE {rmse:.3f}, test LL {ll:.3f}")

    assert rmse < RMSE_MAX, f"{name}: RMSE {rmse:.3f}"
    assert ll > LL_MIN, f"{name}: LL {ll:.3f}"
    # the predictive distribution is not degenerate: noise floor and spread are sensible
    assert float(pred.stddev.mean()) * sd_y < 2 * RMSE_MAX

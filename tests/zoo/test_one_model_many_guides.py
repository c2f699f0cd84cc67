"""One model object, three guides, one table: the same table as three separately built models.

``BayesianMLP``'s learned noise is a latent site that each guide infers with its own parameters
(``likelihood.noise_scale``), and every guide instance has its own names in Pyro's param
store, so fitting a guide on a shared model changes nothing that another fit uses.
"""

import pandas as pd
import pyro
import pytest
import torch

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    compare,
    fit,
    predict,
)

GUIDES = {
    "mc_dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "bbb": lambda m: AutoMeanField(m),
    "vd": lambda m: AutoVariationalDropout(m),
}


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, torch.sin(2 * x[:, 0]) + 0.3 * torch.randn(n, generator=g)


def _fits(models):
    x, y = _data(80, 0)
    fits = {}
    for i, name in enumerate(GUIDES):
        guide = GUIDES[name](models[name])
        fit(models[name], guide, x, y, num_steps=80, lr=0.03, progress=False, seed=i)
        fits[name] = (models[name], guide)
    return fits


def _table(fits):
    x, y = _data(80, 0)
    x_test, y_test = _data(40, 1)
    pyro.set_rng_seed(123)
    return compare(fits, x=x, y=y, x_test=x_test, y_test=y_test, num_samples=60)


def _model():
    return BayesianMLP(2, 1, hidden=(16,))  # tau=None: the noise is learned


def test_one_model_three_guides_gives_the_separate_models_table():
    shared = _model()
    one = _table(_fits({name: shared for name in GUIDES}))
    separate = _table(_fits({name: _model() for name in GUIDES}))
    pd.testing.assert_frame_equal(one, separate, check_exact=False, rtol=1e-5, atol=1e-8)


def test_fitting_other_guides_does_not_move_an_earlier_fits_predictions():
    model = _model()
    x, y = _data(80, 0)
    first = AutoDropout(model, dropout_rate=0.1)
    fit(model, first, x, y, num_steps=80, lr=0.03, progress=False, seed=0)
    before = predict(model, first, x, num_samples=50, seed=5).log_likelihood(y)
    # incl. a second dropout guide, which takes another param-store name while the first lives
    with pytest.warns(UserWarning, match="uses 'AutoDropout_1'"):
        for make in (GUIDES["bbb"], GUIDES["vd"], GUIDES["mc_dropout"]):
            fit(model, make(model), x, y, num_steps=80, lr=0.03, progress=False, seed=1)
    after = predict(model, first, x, num_samples=50, seed=5).log_likelihood(y)
    torch.testing.assert_close(before, after)

"""Defaults that work on small data: on small tabular regression sets shipped with packages
(scikit-learn's diabetes, 442 rows; mlxtend's auto-mpg, 392 rows, and Boston housing, 506
rows), each Gaussian guide with its documented defaults reaches a held-out log-likelihood
within 0.2 nats per point of MC dropout's (also with its defaults: the model's inputs kept,
issue 39). The margin was 0.1 while MC dropout dropped the model's inputs; keeping them made MC
dropout better on Boston by more than the others (measured at the merge of issue 39's branches:
dropout −0.127, mean-field −0.298, VD −0.236), and better everywhere on the README's small sets.

``AutoConcreteDropout`` with its defaults too, since its slab widened to σ = 0.05 (issue 39,
item 6): at σ = 0.01 its rates fell to ~0 and the fit over-fit (diabetes −5.89 against MC
dropout's −1.33; auto-mpg −0.79 against −0.48; Boston −1.06 against −0.13); at 0.05 −1.18,
−0.45, −0.12 (docs page *Concrete dropout*, "Defaults on small data").

Recipe (the one the README and the "Bring your own model" page show): standardised inputs and
targets, ``BayesianMLP(d, 1, hidden=(50,))`` (learned noise, ``Normal(0, 1)`` prior), each guide
with its default arguments, ``fit(..., num_steps=1000)`` with ``fit``'s default learning rate
(1e-2 since issue 39; the recipe's value before) on the whole training set;
three random 80/20 splits per data set; the mean over splits is compared. (Before variational
dropout's variance was made exactly σ², its held-out log-likelihood here trailed MC dropout's
by 0.14-0.6 nats per point.)
"""

import numpy as np
import pytest
import torch

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    predict,
)

pytestmark = pytest.mark.slow

GUIDES = {
    "dropout": AutoDropout,
    "mean_field": AutoMeanField,
    "vd": AutoVariationalDropout,
    "concrete": AutoConcreteDropout,
}
SPLITS = 3
MARGIN = 0.2


def _dataset(name):
    pytest.importorskip("mlxtend", reason="needs the examples extra: pip install -e '.[examples]'")
    from mlxtend.data import autompg_data, boston_housing_data
    from sklearn.datasets import load_diabetes

    if name == "diabetes":
        return load_diabetes(return_X_y=True)
    if name == "autompg":
        x, y = autompg_data()
        return x[:, :7], y  # the last column is the car's name (NaN as a number)
    return boston_housing_data()


def _held_out_ll(x, y, split, make_guide):
    rng = np.random.default_rng(split)
    idx = rng.permutation(len(y))
    tr, te = idx[: int(0.8 * len(y))], idx[int(0.8 * len(y)) :]
    mx, sx, my, sy = x[tr].mean(0), x[tr].std(0), y[tr].mean(), y[tr].std()
    x_tr, x_te = (x[tr] - mx) / sx, (x[te] - mx) / sx
    y_tr, y_te = (y[tr] - my) / sy, (y[te] - my) / sy
    model = BayesianMLP(x.shape[1], 1, hidden=(50,))
    guide = make_guide(model)
    fit(model, guide, x_tr, y_tr, num_steps=1000, progress=False, seed=split, jit=True)
    pred = predict(model, guide, x_te, num_samples=200, seed=0)
    return float(pred.log_likelihood(y_te).mean())


def _scores(name, guides):
    torch.set_num_threads(1)
    x, y = _dataset(name)
    return {
        g: np.mean([_held_out_ll(x, y, s, make) for s in range(SPLITS)])
        for g, make in guides.items()
    }


@pytest.mark.parametrize("name", ["diabetes", "autompg", "boston"])
def test_every_guide_is_within_a_fifth_of_a_nat_of_mc_dropout(name):
    scores = _scores(name, GUIDES)
    print(name, {g: round(v, 3) for g, v in scores.items()})
    for g in ("mean_field", "vd", "concrete"):
        assert scores[g] > scores["dropout"] - MARGIN, (name, scores)

# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One model, four guides: a UCI regression compared through ArviZ
#
# We write **one** Bayesian network, a `BayesianMLP` with one hidden layer of 50 units (the
# UCI architecture of Gal & Ghahramani 2016), and fit it unchanged with the four guides of
# `pyro_dropout`:
#
# | guide | family |
# | --- | --- |
# | `AutoDropout` | MC dropout: $W = M\,\mathrm{diag}(z) + \sigma\varepsilon$, $z\sim\mathrm{Bernoulli}(1-p)$ |
# | `AutoConcreteDropout` | the same family with $p$ learned through a Concrete relaxation of the mask |
# | `AutoMeanField` | Bayes by Backprop: $\mathcal N(\mu, \mathrm{softplus}(\rho)^2)$ per weight |
# | `AutoVariationalDropout` | $\mathcal N(\theta, \alpha\theta^2)$ with a learned $\alpha$ per weight |
#
# All four are trained with local reparameterisation and Pyro's `TraceMeanField_ELBO`, then
# exported to ArviZ and compared: PSIS-LOO on the training rows, the VI $\hat k$ of
# Yao et al. (2018), and held-out scores on the test rows of the published split.
#
# **Budget.** Full run (`PYRO_DROPOUT_QUICK` unset): 400 epochs per guide, about a minute on
# one CPU core in total. Quick run (`PYRO_DROPOUT_QUICK=1`, used by the tests): 40 epochs.

# %%
import math
import os
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    fit,
    local_reparameterization,
    predict,
)
from pyro_dropout.datasets import load_uci
from pyro_dropout.diagnostics import (
    compare,
    plot_calibration,
    plot_compare,
    plot_khat,
    summary,
    to_inference_data,
)

# %% tags=["parameters"]
QUICK = os.environ.get("PYRO_DROPOUT_QUICK", "0") == "1"
DATASET = "bostonHousing"
SPLIT = 0
#: Folder with one sub-folder per UCI dataset; default ../shared/data/uci next to the repo.
UCI_DIR = os.environ.get("PYRO_DROPOUT_UCI_DIR")
EPOCHS = 40 if QUICK else 400
NUM_DRAWS = 100 if QUICK else 500  # guide draws for the ArviZ export
SEED = 0


# %%
def repo_root():
    """The folder holding pyproject.toml, searched upwards from this notebook."""
    here = Path(globals().get("__file__", Path.cwd() / "notebook")).resolve().parent
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return here.parent


UCI_DIR = Path(UCI_DIR) if UCI_DIR else repo_root().parent / "shared" / "data" / "uci"
print("UCI data:", UCI_DIR)
torch.set_num_threads(1)  # a net this small runs fastest on one thread
pyro.clear_param_store()

# %% [markdown]
# ## Data: the published split
#
# `load_uci` reads the fixed train/test indices of Hernández-Lobato & Adams (2015).
# `split_arrays` standardises $x$ and $y$ with the training rows' statistics; metrics are
# reported on the original scale (RMSE times $s_y$, log-likelihood minus $\log s_y$).

# %%
ds = load_uci(DATASET, UCI_DIR)
split = ds.split_arrays(SPLIT)
y_sd = split.standardizer.y_std
print(ds)
print(f"train {split.n_train} rows, test {split.n_test} rows, y sd {y_sd:.2f}")

# %% [markdown]
# ## One model
#
# The noise precision $\tau$ is given on the original scale (the benchmark's grid); on the
# standardised scale it is $\tau s_y^2$. The prior is $\mathcal N(0, 1)$ on every weight.

# %%
tau = ds.tau_values[len(ds.tau_values) // 2] * y_sd**2
model = BayesianMLP(ds.n_features, 1, hidden=(ds.n_hidden,), tau=tau, prior=1.0)
print(model)

# %% [markdown]
# ## Four guides, swapped on the same model object

# %%
guides = {
    "mc_dropout": AutoDropout(model, dropout_rate=0.05),
    "concrete_dropout": AutoConcreteDropout(model),  # p learned, from 0.1
    "mean_field": AutoMeanField(model),
    "variational_dropout": AutoVariationalDropout(model, alpha="weight"),
}
losses = {}
for i, (name, guide) in enumerate(guides.items()):
    losses[name] = fit(
        model,
        guide,
        split.x_train,
        split.y_train,
        num_epochs=EPOCHS,
        batch_size=32,
        lr=3e-3,
        progress=False,
        seed=SEED + i,
    )
    print(f"{name:20s} final loss {sum(losses[name][-20:]) / 20:10.1f}")

# %% [markdown]
# ## Held-out RMSE and log-likelihood (Gal's protocol)
#
# `predict` draws $T$ stochastic passes (for `AutoDropout` exactly MC dropout);
# `Prediction.log_likelihood` is Gal's $\operatorname{logsumexp}_t(-\tfrac\tau2(y-\hat y_t)^2)
# - \log T - \tfrac12\log 2\pi + \tfrac12\log\tau$.

# %%
for name, guide in guides.items():
    pred = predict(model, guide, split.x_test, num_samples=1000, seed=SEED)
    rmse = float(((pred.mean[:, 0] - split.y_test) ** 2).mean().sqrt()) * y_sd
    ll = float(pred.log_likelihood(split.y_test).mean()) - math.log(y_sd)
    print(f"{name:20s} RMSE {rmse:6.3f}   test LL {ll:7.3f}")

# %% [markdown]
# ## The learned drop rates
#
# `AutoDropout` used the fixed $p = 0.05$ we gave it; `AutoConcreteDropout` started every
# layer at $p = 0.1$ and learned one rate per weight site (`rate_per="unit"` would learn one per
# input unit). Training used relaxed masks; `predict` and the ArviZ export below draw hard
# Bernoulli masks with these rates.

# %%
for site, p in guides["concrete_dropout"].dropout_rates().items():
    print(f"{site:22s} learned drop rate {float(p):.4f}")

# %% [markdown]
# The published MC-dropout numbers for Boston (mean over 20 splits, grid-searched $p$ and
# $\tau$, 4000 epochs) are RMSE 2.90 and LL −2.40; one split with fixed hyper-parameters is
# not a benchmark, only a sanity check.
#
# ## Export to ArviZ and compare
#
# `to_inference_data` draws weights from each guide (no local reparameterisation: one draw is
# one network) and records the pointwise log-likelihood, posterior-predictive draws,
# $\log p(\theta, D)$ and $\log q(\theta)$. `compare` runs `az.compare` on PSIS-LOO and adds
# the VI $\hat k$ and held-out scores.

# %%
fits = {
    name: to_inference_data(
        model,
        guide,
        split.x_train,
        split.y_train,
        num_samples=NUM_DRAWS,
        x_test=split.x_test,
        y_test=split.y_test,
        parallel=True,
        seed=SEED,
    )
    for name, guide in guides.items()
}
table = compare(fits)
table[["elpd_loo", "p_loo", "loo_max_k", "loo_n_high_k", "vi_khat", "test_lpd", "test_cov90"]]

# %% [markdown]
# How to read it:
#
# * **PSIS-LOO** treats the guide draws as posterior draws. Look at `loo_max_k` and
#   `loo_n_high_k` first: with a fixed, large $\tau$ a single weight draw can move a
#   prediction by several noise standard deviations, the pointwise log-likelihoods are
#   heavy-tailed and many Pareto $\hat k$ exceed the threshold, so `elpd_loo` (and `p_loo`,
#   which here exceeds the number of parameters one would believe) is not trustworthy.
# * **VI $\hat k$** (Yao et al. 2018) fits a generalised Pareto tail to
#   $\log p(\theta_s, D) - \log q(\theta_s)$. Below 0.5 the guide is close to the posterior,
#   0.5–0.7 usable, above 0.7 unreliable. For a network with thousands of weights all
#   four factorised guides land far above 0.7: they are useful predictors, not accurate
#   posteriors.
# * **Held-out scores** (`test_lpd` per point on the standardised scale, coverage of the 90 %
#   interval) do not depend on either assumption and are the comparison to trust here.

# %%
fig = plot_compare(table)

# %%
fig = plot_khat(fits)

# %%
fig = plot_calibration(fits)

# %% [markdown]
# ## One chain: R-hat is not a pass
#
# Variational draws come from one "chain", so R-hat is undefined: ArviZ reports NaN, which
# means *not assessable*, never *converged*. The effective sample sizes of independent guide
# draws are close to the number of draws.

# %%
summary(fits["mc_dropout"], ["net.layers.1.bias"])[["mean", "sd", "ess_bulk", "r_hat"]]

# %% [markdown]
# ## The same fit in plain Pyro
#
# `fit` is a convenience. Underneath it is `SVI` with `TraceMeanField_ELBO` (analytic KLs)
# inside the local-reparameterisation handler, with the likelihood scaled by $N/B$ for
# minibatches:

# %%
pyro.clear_param_store()  # a new guide of a class already fitted must not inherit its values
guide = AutoDropout(model, dropout_rate=0.05)
svi = SVI(model, guide, pyro.optim.Adam({"lr": 3e-3}), TraceMeanField_ELBO())
with local_reparameterization():
    for _ in range(5):
        loss = svi.step(split.x_train, split.y_train)
print(f"plain-Pyro loss after 5 full-batch steps: {loss:.1f}")

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
# # The Bayesian workflow with a neural network
#
# The Bayesian workflow (Gelman et al. 2020, "Bayesian Workflow"; Gabry et al. 2019,
# "Visualization in Bayesian workflow") starts before the fit and ends after it. On one small
# regression network this notebook runs every step the library offers, and says after each
# what it told us:
#
# 1. **Prior predictive check**: what functions does the prior over weights imply? We change
#    the prior because of what we see.
# 2. **Fit** with the four guides of the library.
# 3. **Posterior predictive checks** with ArviZ's own plots, and **LOO-PIT** as a number.
# 4. **Compare** the fits in one table.
# 5. **Simulation-based calibration** (SBC): first on a model whose posterior is known (does
#    the check work?), then on a small network (does each guide's fit work?).
# 6. **A NUTS reference** on the same model: which guide is closest to the posterior?
#
# **Budget.** Full run: 2,000 SVI steps per guide, SBC with 30 replications of 2 guides, NUTS
# 2 chains × (300 + 300) iterations; about 9 minutes on 2 shared cores. Quick run
# (`PYRO_DROPOUT_QUICK=1`, what CI executes): a few steps, draws and replications, numbers
# meaningless. The rendered notebook is the full run.

# %%
import functools
import os
import warnings

import numpy as np
import pandas as pd
import pyro.distributions as dist
import torch

import pyro_dropout as pdo
from pyro_dropout import diagnostics as dg

torch.set_num_threads(1)
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 30)

# %% tags=["parameters"]
QUICK = os.environ.get("PYRO_DROPOUT_QUICK", "0") == "1"
STEPS = 60 if QUICK else 2000  # SVI steps per guide
DRAWS = 40 if QUICK else 500  # guide draws per export (PSIS-LOO needs >= 25)
SBC_REPS = 3 if QUICK else 30  # SBC replications of the network
SBC_STEPS = 30 if QUICK else 1000  # SVI steps per SBC fit
NUTS = (
    {"num_chains": 2, "num_warmup": 10, "num_samples": 30, "max_tree_depth": 4}
    if QUICK
    else {"num_chains": 2, "num_warmup": 300, "num_samples": 300, "max_tree_depth": 7}
)

# %% [markdown]
# ## The data
#
# 60 noisy observations of a smooth function on [-2, 2]; the test inputs extend to [-3, 3].

# %%
g = torch.Generator().manual_seed(0)


def truth(x):
    return torch.sin(2 * x) + 0.3 * x


x = 4 * torch.rand(60, 1, generator=g) - 2
y = truth(x[:, 0]) + 0.2 * torch.randn(60, generator=g)
x_test = torch.linspace(-3, 3, 61)[:, None]
y_test = truth(x_test[:, 0]) + 0.2 * torch.randn(61, generator=g)
print(f"y: mean {y.mean():.2f}, sd {y.std():.2f}, range [{y.min():.2f}, {y.max():.2f}]")

# %% [markdown]
# ## 1. Prior predictive check
#
# The model: one hidden layer of 10 tanh units, a Gaussian likelihood with the noise known
# (`tau` = 1/0.2²), and this library's default prior, N(0, 1) on every weight and bias.
# Before fitting, export the prior alone (`guide=None, prior=True`): each draw runs the model
# as written without a guide, so the weights come from their prior and the functions they
# compute are the prior over functions. `plot_prior_functions` draws 30 of them, the 50 % and
# 90 % bands of the prior predictive and the data.

# %%
default = pdo.BayesianMLP(1, 1, hidden=(10,), activation="tanh", tau=25.0)
prior_default = pdo.to_inference_data(default, None, x, y, num_samples=500, prior=True, seed=0)
fig = dg.plot_prior_functions(prior_default)


def prior_function_sd(data):
    return float(data["prior_predictive"]["obs_mean"].values.std())


print(f"prior sd of f(x): {prior_function_sd(prior_default):.2f}; sd of y: {y.std():.2f}")

# %% [markdown]
# **What it told us** (the numbers in this and the later notes are the full run's). The
# functions have a plausible smoothness, but their prior sd is 2.4 where the data's is 0.9:
# the prior puts much of its mass on functions far larger than anything in the data. The reason is the output layer: f is a sum of 10 terms `w_k tanh(...)` with
# `w_k ~ N(0, 1)`, so its prior sd grows like the square root of the width. The usual fix
# (Neal 1996) scales the output weights' prior by 1/sqrt(fan-in): `prior` accepts a callable
# `shape -> distribution`. The first layer (fan-in 1) keeps N(0, 1).


# %%
def fan_in_prior(shape):
    """N(0, 1/fan_in) on a (out, in) weight."""
    return dist.Normal(0.0, shape[-1] ** -0.5)


model = pdo.BayesianMLP(1, 1, hidden=(10,), activation="tanh", tau=25.0, prior=fan_in_prior)
prior_scaled = pdo.to_inference_data(model, None, x, y, num_samples=500, prior=True, seed=0)
fig = dg.plot_prior_functions({"N(0, 1)": prior_default, "N(0, 1/fan-in)": prior_scaled})
print(f"prior sd of f(x): {prior_function_sd(prior_scaled):.2f}; sd of y: {y.std():.2f}")

# %% [markdown]
# Now the prior functions live on the scale of the data while still allowing every shape the
# data could have: the prior is weakly informative, which is what we want. We keep it.
#
# ## 2. Fit with the four guides
#
# One model, four guides: MC dropout (`AutoDropout`), Concrete dropout, Bayes by Backprop
# (`AutoMeanField`) and variational dropout (`AutoVariationalDropout`, one drop rate per
# weight), each trained with `fit` (local reparameterisation, compiled steps).

# %%
guides = {
    "mc_dropout": pdo.AutoDropout(model, dropout_rate=0.1),
    "concrete": pdo.AutoConcreteDropout(model),
    "mean_field": pdo.AutoMeanField(model),
    "var_dropout": pdo.AutoVariationalDropout(model, alpha="weight"),
}
for name, guide in guides.items():
    losses = pdo.fit(model, guide, x, y, num_steps=STEPS, lr=1e-2, progress=False, seed=0)
    print(f"{name:12s} final loss {np.mean(losses[-100:]):8.2f}")

# %% [markdown]
# Each fit is exported with its prior (`prior=True`) and the test set, so that one object
# carries the prior predictive, the posterior predictive, the pointwise log-likelihood and
# the held-out predictions.

# %%
fits = {
    name: pdo.to_inference_data(model, guide, x, y, DRAWS, x_test, y_test, prior=True, seed=1)
    for name, guide in guides.items()
}
fig = dg.plot_predictive_bands(fits, ncols=4)

# %% [markdown]
# ## 3. Posterior predictive checks and LOO-PIT
#
# ArviZ's own checks run on the exports unchanged (`az.plot_ppc`, `az.plot_loo_pit`,
# `az.plot_bpv` on ArviZ 0.23; `plot_ppc_dist`, `plot_loo_pit`, `plot_ppc_pit` of
# arviz-plots on 1.x); `plot_ppc_grid` lays them side by side, one column per guide. The
# posterior predictive check compares replicated data sets with the observed one; the LOO-PIT
# asks whether each observation is a typical draw from the predictive distribution fitted
# *without* it: uniform when calibrated, U-shaped when the predictive is too narrow,
# hump-shaped when too wide.

# %%
fig = dg.plot_ppc_grid(fits, kinds=("ppc", "loo_pit"))


def pit_ks(d):
    """KS distance from uniform of the PIT of the training targets, without leaving out."""
    y_obs = d["observed_data"]["obs"].values
    y_rep = d["posterior_predictive"]["obs"].values.reshape(-1, *y_obs.shape)
    return dg.ks_uniform(dg.pit(y_obs, y_rep))


print(f"KS distance clearly non-uniform above about {1.36 / np.sqrt(len(y)):.3f}")
for name, d in fits.items():
    lr = dg.loo(d)
    print(
        f"{name:12s} LOO-PIT KS {dg.loo_pit_ks(d):.3f} (PSIS k-hat max {lr.pareto_k.max():.2f}, "
        f"above {lr.good_k:.2f} at {np.mean(lr.pareto_k > lr.good_k):.0%} of the points); "
        f"PIT KS without leaving out {pit_ks(d):.3f}"
    )

# %% [markdown]
# **What it told us.** The replicated data sets cover the observed one for every guide: the
# model with the scaled prior and the known noise can produce data like ours. Read literally,
# the LOO-PIT separates the guides: Concrete dropout's is uniform (KS 0.09, below the 0.18
# threshold), the two Gaussian guides are at the threshold (0.19) and MC dropout's is
# U-shaped (0.42), as if its leave-one-out predictive were far too narrow. But the LOO-PIT is
# only as good as the PSIS weights behind it, and they are unreliable for every fit (k̂ above
# good_k at half the points or more), worst for MC dropout (k̂ up to 3.8): its leave-one-out
# predictive rests on a handful of draws, those whose function misses the left-out point,
# which pushes the point into the tails. The PIT without leaving out shows no U for MC dropout
# (KS 0.04). `compare` marks `loo_pit_ks` with `!` when the weights are flagged: read it
# together with `loo_max_k`.
#
# ## 4. Compare
#
# `compare` puts everything in one table: PSIS-LOO (with its reliability flags), the VI
# k̂ of Yao et al. (2018), the held-out scores, the coverage of the central intervals, the
# LOO-PIT KS distance next to them, and, as the exports carry the prior,
# `fn_contraction`: how much the data narrowed the prior in function space
# (1 − posterior variance / prior variance of f at the training inputs).

# %%
table = dg.compare(fits)
cols = ["elpd_loo", "loo_max_k", "vi_khat", "test_lpd", "test_rmse", "test_cov90"]
cols += ["loo_pit_ks", "fn_contraction", "flags"]
print(table[cols].round(3).to_string())

# %% [markdown]
# **What it told us.** The held-out scores rank MC dropout first (test_lpd −0.64) and
# Concrete dropout last (−1.08), the reverse of the LOO-PIT: the test inputs reach beyond the
# data, to [−3, 3], where wide bands pay off, and every guide's 90 % interval covers far
# less than 90 % of the test points there (0.57 to 0.77). PSIS-LOO is flagged unreliable for
# every fit (k̂ above good_k at half the points or more) and the VI k̂ is above 1 for every
# guide, as on every network we measured, so neither ranks them. `fn_contraction` near 1
# says the data, not the prior, decided the function at the training inputs. What none of
# these says is whether a guide's uncertainty is right *on average over data sets the model
# could have produced*: that is SBC's question.
#
# ## 5. Simulation-based calibration
#
# `simulation_based_calibration` repeats: draw the weights from the prior, simulate a
# training set at `x`, fit each guide on it, and rank the true function values at a few test
# inputs among the fitted guide's draws (Talts et al. 2018). For the exact posterior the
# ranks are uniform; U-shaped ranks mean an over-confident guide, a hump an under-confident
# one. `rank_spread` is 1 for uniform ranks (2 at most, 0 at least); `pvalue` tests
# uniformity; `vsbc_pvalue` tests the symmetry of Yao et al.'s (2018) VSBC (is the guide
# biased?).
#
# **First, does the check work?** On a conjugate Bayesian linear regression the posterior is
# known in closed form: the exact posterior must pass and the same posterior with its scale
# shrunk ×0.3 must fail.

# %%
conj = dg.ConjugateLinearRegression(2)
xc, xc_test = torch.randn(20, 2, generator=g), torch.randn(3, 2, generator=g)
control = dg.simulation_based_calibration(
    conj,
    {
        "exact": dg.ExactPosteriorGuide,
        "over-confident": functools.partial(dg.ExactPosteriorGuide, scale=0.3),
    },
    xc,
    xc_test,
    num_steps=0,  # closed form: nothing to fit
    num_replications=20 if QUICK else 200,
    num_samples=99,
)
print(control.table()[["pvalue", "rank_spread", "vsbc_pvalue"]].to_string())
fig = control.plot(bins=10)

# %% [markdown]
# It does: uniform ranks for the exact posterior (p = 0.57, spread 1.01 with 200
# replications), the U of over-confidence for the shrunk one (p ≈ 1e-137, spread 1.65).
#
# **Then the network.** SBC needs one fit per replication and guide, so it runs on a smaller
# problem: the same architecture and prior, 30 training inputs, 3 test inputs, two guides.
# (`processes=k` runs the replications in parallel processes and `folder=` makes a long run
# resumable; here one process.)

# %%
x_sbc = torch.linspace(-2, 2, 30)[:, None]
x_sbc_test = torch.tensor([[-1.5], [0.0], [1.5]])
sbc = dg.simulation_based_calibration(
    model,
    {
        "mc_dropout": functools.partial(pdo.AutoDropout, dropout_rate=0.1),
        "mean_field": pdo.AutoMeanField,
    },
    x_sbc,
    x_sbc_test,
    num_replications=SBC_REPS,
    num_steps=SBC_STEPS,
    num_samples=99,
    seed=0,
)
print(sbc.table()[["pvalue", "rank_spread", "rank_bias", "vsbc_pvalue", "seconds"]].to_string())
fig = sbc.plot()

# %% [markdown]
# **What it told us.** Neither guide is calibrated over the prior, in opposite directions.
# MC dropout's ranks are U-shaped (rank_spread 1.15, p = 2e-5): on data sets drawn from this
# model its function-space intervals are too narrow on average, although on our one data set
# its predictive was too wide. Mean field's ranks are bunched in the middle (rank_spread 0.60,
# p = 2e-4): its function-space uncertainty is too wide. Neither is biased (VSBC p = 0.39 and
# 0.97). A flat histogram would have meant intervals that can be taken at face value.
#
# ## 6. The NUTS reference
#
# Last, the question SBC cannot answer for one data set: how close is each guide to *this*
# posterior? `reference_posterior` runs NUTS on the same model object (same prior, same
# likelihood) and exports it like a fit; `compare(..., reference=ref)` adds the fidelity
# scores (1-D Wasserstein distance of the predictive, sd ratio and coverage of the
# reference's intervals; Izmailov et al. 2021) with their noise floor.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", dg.ReferenceConvergenceWarning)
    ref = dg.reference_posterior(model, x, y, x_test, y_test, processes=1, seed=0, **NUTS)
for w in caught:
    print(f"{w.category.__name__}: {w.message}")
table = dg.compare(fits, reference=ref)
cols = ["test_lpd", "ref_w1", "ref_sd_ratio", "ref_cov90", "ref_w1_floor", "ref_rhat"]
print(table[cols].round(3).to_string())
fig = dg.plot_predictive_bands({"NUTS": ref, **fits}, ncols=5)

# %% [markdown]
# ## What each step told us
#
# * **Prior predictive check**: the default N(0, 1) prior implied functions 2.7 times larger
#   than the data; scaling the output layer's prior by 1/sqrt(fan-in) put them on the data's
#   scale without making the prior informative about shape. Nothing later would have flagged
#   it: with 60 points the posterior overrides the prior where the data are.
# * **Posterior predictive checks and LOO-PIT**: the model can reproduce the data. The LOO-PIT
#   KS distance is small for Concrete dropout and large for MC dropout, but with PSIS k̂ far
#   above 0.7 it is unreliable (MC dropout's U is an artefact of its importance weights:
#   without leaving out, its PIT is uniform); `compare` flags it.
# * **Compare**: the held-out scores, on inputs beyond the data, rank the guides the other way
#   round and show every guide over-confident away from the data; PSIS-LOO and the VI k̂ are
#   flagged for every fit and rank nothing.
# * **SBC**: the check itself works (exact passes, over-confident fails); on the network, MC
#   dropout is over-confident and mean field under-confident on average over the prior, a
#   property of the method and its budget rather than of one data set.
# * **NUTS reference**: on this data set Concrete dropout is closest to the posterior (within
#   a little of the reference's own noise floor), mean field and variational dropout are 10 %
#   too wide, MC dropout furthest (70 % too wide), although it has the best held-out density:
#   predicting well beyond the data and being close to the posterior are different things.

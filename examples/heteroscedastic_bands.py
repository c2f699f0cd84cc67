"""The 1-D example of docs/heteroscedastic.md: homoscedastic vs heteroscedastic, fixed vs learned
prior, and the picture of the aleatoric and epistemic bands (docs/assets/heteroscedastic.png).

    python examples/heteroscedastic_bands.py            # prints the table, writes the PNG

One torch thread, about a minute on a laptop core.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyro
import torch

import pyro_dropout as pd

OUT = Path(__file__).resolve().parents[1] / "docs" / "assets" / "heteroscedastic.png"


def noise_sd(x):
    return 0.1 + 0.4 * x.abs()


def data(n, seed, gap=True):
    """y = sin(2x) + σ(x) ε, σ(x) = 0.1 + 0.4|x|; training inputs leave out (0.5, 1.2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(4 * n, 1, generator=g) * 4 - 2
    if gap:
        x = x[(x < 0.5) | (x > 1.2)]
    x = x[:n].reshape(-1, 1)
    y = torch.sin(2 * x) + noise_sd(x) * torch.randn(x.shape, generator=g)
    return x, y.squeeze(-1)


def fit_all(x, y, epochs=300):
    fits = {}
    for lik in ("regression", "heteroscedastic"):
        for prior in (1.0, "learned"):
            pyro.clear_param_store()
            pyro.set_rng_seed(0)
            model = pd.BayesianMLP(1, 1, hidden=(50,), likelihood=lik, prior=prior)
            guide = pd.AutoMeanField(model)
            pd.fit(model, guide, x, y, num_epochs=epochs, batch_size=128, lr=0.01, progress=False)
            name = f"{'hetero' if lik == 'heteroscedastic' else 'homo'}, prior {prior}"
            fits[name] = (model, guide)
    return fits


def main(png=OUT):
    torch.set_num_threads(1)
    start = time.perf_counter()
    x, y = data(1000, seed=0)
    xt, yt = data(2000, seed=1, gap=False)
    fits = fit_all(x, y)
    print("| model | test LL per point | test RMSE | fitted σ at x = 0 / 1.5 (truth 0.1 / 0.7) |")
    print("| --- | --- | --- | --- |")
    probe = torch.tensor([[0.0], [1.5]])
    for name, (model, guide) in fits.items():
        pred = pd.predict(model, guide, xt, num_samples=200, seed=0)
        ll = float(pred.log_likelihood(yt).mean())
        rmse = float((pred.mean.squeeze(-1) - yt).pow(2).mean().sqrt())
        s = pd.predict(model, guide, probe, num_samples=200, seed=0).aleatoric_variance.sqrt()
        print(f"| {name} | {ll:.3f} | {rmse:.3f} | {float(s[0]):.2f} / {float(s[1]):.2f} |")
    model, guide = fits["hetero, prior learned"]
    scales = {k: round(float(v), 3) for k, v in guide.median().items() if "prior_scale" in k}
    print("learned prior scales:", scales)
    grid = torch.linspace(-2.5, 2.5, 201).reshape(-1, 1)
    pred = pd.predict(model, guide, grid, num_samples=300, seed=0)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = grid.squeeze(-1).numpy()
    mean = pred.mean.squeeze(-1).numpy()
    epi = pred.epistemic_variance.squeeze(-1).sqrt().numpy()
    tot = pred.variance.squeeze(-1).sqrt().numpy()
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
    ax.scatter(x.squeeze(-1), y, s=3, c="0.6", label="training data")
    ax.fill_between(
        g,
        mean - 2 * tot,
        mean + 2 * tot,
        color="tab:orange",
        alpha=0.25,
        label="±2 sd, total (aleatoric + epistemic)",
    )
    ax.fill_between(
        g, mean - 2 * epi, mean + 2 * epi, color="tab:blue", alpha=0.5, label="±2 sd, epistemic"
    )
    ax.plot(g, torch.sin(2 * grid).squeeze(-1).numpy(), "k--", lw=1, label="truth sin(2x)")
    ax.plot(g, mean, c="tab:blue", lw=1.2, label="predictive mean")
    ax.axvspan(0.5, 1.2, color="0.9", zorder=0)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_ylim(-3.5, 3.5)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    ax.set_title("heteroscedastic BayesianMLP, learned prior, AutoMeanField", fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    print(f"wrote {png} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)

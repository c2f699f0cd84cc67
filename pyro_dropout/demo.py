"""The README's first command: ``python -m pyro_dropout.demo``.

One :class:`~pyro_dropout.BayesianMLP` is fitted to the Mauna Loa CO2 series (weekly,
1958-1989; :func:`~pyro_dropout.datasets.co2_extrapolation_split`, data shipped with
statsmodels) with the three guides, :class:`~pyro_dropout.AutoDropout` (MC dropout),
:class:`~pyro_dropout.AutoMeanField` (Bayes by Backprop) and
:class:`~pyro_dropout.AutoVariationalDropout` (learned α per weight). The *same model object*
is passed to every guide, and each fit trains the compiled loss (``fit``'s default, ``jit="auto"``:
half the CPU time of the eager loss here). The script then

* prints the :func:`~pyro_dropout.diagnostics.compare` table (PSIS-LOO on the training
  years, VI k̂, held-out scores on 1990-2001) with the unreliable numbers marked ``!`` and one
  line per kind of flag below it
  (:func:`~pyro_dropout.diagnostics.reliability.format_table`): on this network PSIS-LOO's
  k̂ exceeds its threshold at most training points, ``p_loo`` can exceed the number of points
  and the VI k̂ is far beyond its range, so the held-out columns are the ones to rank by; and
* writes the predictive-band figure in the style of Gal & Ghahramani (2016, Fig. 1): one
  panel per guide plus **standard dropout with weight averaging**, i.e. the
  :class:`~pyro_dropout.AutoDropout` fit evaluated once, deterministically, with its mean
  weights :math:`E_q[W] = (1-p)M` (``guide.median()``). Standard dropout extrapolates a single
  confident curve; MC dropout averages over dropout masks and its band widens away from the
  data.

It takes about 40 s of CPU (one torch thread; measured on a 2-core machine): 3,000 SVI steps
per guide are 29 s of it, the comparison table 3 s, importing torch, Pyro and ArviZ 3 s.

Command line::

    python -m pyro_dropout.demo --output demo.png --steps 3000 --hidden 100,100 \\
        --activation relu --seed 0

From Python::

    >>> from pyro_dropout.demo import main
    >>> table, path = main(["--steps", "30", "--output", "demo.png"])  # doctest: +SKIP
    >>> list(table.index)  # doctest: +SKIP
    ['mc_dropout', 'mean_field', 'variational_dropout']
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyro
import torch
from pyro import poutine

from .guides import AutoDropout, AutoMeanField, AutoVariationalDropout
from .infer import fit, predict
from .nn import BayesianMLP

__all__ = ["TABLE_COLUMNS", "build_guides", "main", "parse_args", "plot_demo"]

#: Columns of the :func:`~pyro_dropout.diagnostics.compare` table that the demo prints.
TABLE_COLUMNS = (
    "elpd_loo",
    "p_loo",
    "weight",
    "loo_max_k",
    "vi_khat",
    "test_lpd",
    "test_rmse",
    "test_cov90",
)

_PANEL_TITLES = {
    "mc_dropout": "MC dropout (AutoDropout, T passes)",
    "mean_field": "Bayes by Backprop (AutoMeanField)",
    "variational_dropout": "Variational dropout (AutoVariationalDropout)",
}


def _hidden(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--hidden wants widths like 100,100; got {text!r}"
        ) from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"--hidden widths must be positive; got {text!r}")
    return widths


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``argv`` without the program name; ``None``: ``sys.argv``).

    Example:
        >>> parse_args(["--hidden", "50,50", "--activation", "tanh"]).hidden
        (50, 50)
    """
    p = argparse.ArgumentParser(
        prog="python -m pyro_dropout.demo",
        description="Fit one Bayesian MLP to Mauna Loa CO2 with three guides, print the ArviZ "
        "comparison and save the predictive-band figure.",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=Path("pyro_dropout_demo.png"),
        help="figure file (default: %(default)s in the current directory)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=3000,
        help="SVI steps per guide, minibatches of 128 (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument(
        "--hidden",
        type=_hidden,
        default=(100, 100),
        help="hidden widths, comma-separated (default: 100,100)",
    )
    p.add_argument(
        "--activation",
        choices=("relu", "tanh"),
        default="relu",
        help="non-linearity (default: %(default)s)",
    )
    p.add_argument(
        "--dropout-rate",
        type=float,
        default=0.1,
        help="drop probability p of AutoDropout (default: %(default)s)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=200,
        help="guide draws for the bands and the comparison (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; small nets run fastest on one (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.samples < 1 or args.threads < 1:
        p.error("--steps, --samples and --threads must be positive")
    if not 0 < args.dropout_rate < 1:
        p.error("--dropout-rate must lie in (0, 1)")
    return args


def build_guides(model, dropout_rate: float = 0.1) -> dict:
    """The three interchangeable guides for one model, keyed by their ``family``.

    Example:
        >>> guides = build_guides(BayesianMLP(1, 1, hidden=(8,), tau=100.0))
        >>> sorted(guides)
        ['mc_dropout', 'mean_field', 'variational_dropout']
    """
    # Dropout after every hidden layer, as in Gal's Keras nets. The one-dimensional input
    # (time) itself is not dropped: a fraction p of the passes would see no input at all and
    # predict a constant.
    n_layers = len(model.net.layers)
    rates = {f"net.layers.{i}.weight": (dropout_rate if i else 0.0) for i in range(n_layers)}
    guides = (
        AutoDropout(model, dropout_rate=rates),
        AutoMeanField(model),
        AutoVariationalDropout(model, alpha="weight"),
    )
    return {g.family: g for g in guides}


def _bands(model, guide, x, num_samples):
    """(mean, sd) over ``num_samples`` weight draws: each draw is one coherent function."""
    pred = predict(model, guide, x, num_samples=num_samples)  # weight draws (the default)
    return pred.mean[:, 0].numpy(), pred.stddev[:, 0].numpy()


@torch.no_grad()
def _weight_averaged(model, guide, x):
    """Standard dropout at test time: one pass with the mean weights ``E_q[W] = (1-p) M``."""
    return poutine.condition(model, data=guide.median())(x)[:, 0].numpy()


def plot_demo(task, curves: dict, t_grid: np.ndarray, tau: float, path) -> Path:
    """Draw the 2×2 predictive-band figure and save it to ``path``.

    ``curves`` maps panel names to ``(mean, sd)`` on the standardised scale over ``t_grid``
    (decimal years); ``sd`` includes the observation noise ``τ^{-1/2}``.
    """
    from matplotlib.figure import Figure  # no pyplot: no backend or global figure state

    std = task.standardizer
    fig = Figure(figsize=(11, 7.6), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True, sharey=True)
    lo = min(task.ppm_train.min(), task.ppm_test.min()) - 25
    hi = max(task.ppm_train.max(), task.ppm_test.max()) + 60
    for ax, (name, (mean, sd)) in zip(axes.ravel(), curves.items(), strict=True):
        m, s = std.inverse_y(mean), std.inverse_y(sd, kind="std")
        ax.fill_between(
            t_grid, m - 2 * s, m + 2 * s, color="C0", alpha=0.25, lw=0, label="mean ± 2 sd"
        )
        ax.plot(t_grid, m, color="C0", lw=1.5, label="predictive mean")
        ax.plot(task.t_train, task.ppm_train, color="k", lw=0.6, label="training data")
        ax.plot(task.t_test, task.ppm_test, color="C3", lw=0.6, label="held out (1990-2001)")
        ax.axvline(task.cutoff, color="0.4", ls="--", lw=0.8)
        ax.set_title(name, fontsize="medium")
        ax.set_ylim(lo, hi)
    for ax in axes[1]:
        ax.set_xlabel("year")
    for ax in axes[:, 0]:
        ax.set_ylabel("CO$_2$ (ppm)")
    axes[0, 0].legend(fontsize="small", loc="upper left")
    fig.suptitle(
        "Mauna Loa CO$_2$, trained on 1958-1989. Standard dropout = the AutoDropout fit run once "
        "with its mean weights (1-p)M;\nits band is only the fixed noise ±2τ$^{-1/2}$ "
        f"(τ = {tau:g} on the standardised scale). Other bands: ±2 sd over weight draws + noise.",
        fontsize="small",
    )
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None):
    """Run the demo; returns ``(table, figure_path)``: the comparison
    :class:`pandas.DataFrame` (one row per guide) and the :class:`~pathlib.Path` written.

    Example:
        >>> table, path = main(["--steps", "30", "--output", "demo.png"])  # doctest: +SKIP
    """
    args = parse_args(argv)
    from .datasets import co2_extrapolation_split
    from .diagnostics import compare

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        pyro.clear_param_store()  # guides of an earlier run must not lend their parameters
        task = co2_extrapolation_split()
        tau = 100.0  # noise sd 0.1 on the standardised scale (about 1.2 ppm)
        model = BayesianMLP(1, 1, hidden=args.hidden, activation=args.activation, tau=tau)
        guides = build_guides(model, args.dropout_rate)
        for i, guide in enumerate(guides.values()):
            fit(
                model,
                guide,
                task.x_train,
                task.y_train,
                num_steps=args.steps,
                batch_size=128,
                lr=3e-3,
                seed=args.seed + i,
            )

        t_grid = np.linspace(task.t_train[0], 2030.0, 600)
        x_grid = task.standardizer.transform_x(torch.as_tensor(t_grid[:, None])).float()
        noise_sd = np.full_like(t_grid, tau**-0.5)
        curves = {
            "Standard dropout (weight averaging)": (
                _weight_averaged(model, guides["mc_dropout"], x_grid),
                noise_sd,
            )
        }
        for name, guide in guides.items():
            curves[_PANEL_TITLES[name]] = _bands(model, guide, x_grid, args.samples)
        path = plot_demo(task, curves, t_grid, tau, args.output)

        table = compare(
            {name: (model, g) for name, g in guides.items()},
            x=task.x_train,
            y=task.y_train,
            x_test=task.x_test,
            y_test=task.y_test,
            num_samples=args.samples,
            parallel=True,
        )
    finally:
        torch.set_num_threads(threads)
    from .diagnostics.reliability import format_table

    cols = [c for c in TABLE_COLUMNS if c in table.columns]
    print(
        "\nArviZ comparison (LOO on 1958-1989, held-out scores on 1990-2001, "
        "standardised units; ! = unreliable, see below):"
    )
    print(format_table(table, cols))
    print(f"\nfigure: {path.resolve()}  ({time.perf_counter() - start:.0f} s)")
    return table, path


if __name__ == "__main__":
    main()

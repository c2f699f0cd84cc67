"""Held-out log-likelihood of guide settings on small regression sets: the experiment behind
the defaults of ``AutoDropout``, ``AutoConcreteDropout`` and ``fit``'s learning rate (issue 39).

    PYTHONPATH=. OMP_NUM_THREADS=1 python tools/small_data_defaults.py \
        [--configs a,b,...] [--datasets diabetes,yacht,...] [--splits 2] [--steps 1000]

Data: scikit-learn's diabetes (442 rows; random 90/10 splits, seeds 0, 1, ...) and the UCI
"small five" (``../shared/data/uci`` beside the repository, or ``--uci DIR``; their published splits 0, 1, ...).
Inputs and targets standardised on the training rows; ``BayesianMLP(d, 1, hidden=(50,))``
(learned noise scale, ``Normal(0, 1)`` prior); ``fit(..., num_steps=STEPS, batch_size=128)``;
``predict(num_samples=200)``. Prints one markdown row per data set: the mean test
log-likelihood per point in the target's original units (± its standard error over splits).
A measuring aid, not a test; one thread, one process.
"""

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

import pyro_dropout as pd


def _hidden_rates(model, rate, input_rate):
    n = len(model.net.layers)
    return {f"net.layers.{i}.weight": (rate if i else input_rate) for i in range(n)}


#: name -> (guide factory, learning rate). The dropout rates are given per layer (a mapping)
#: so that each row means the same thing whatever AutoDropout's default for the inputs.
CONFIGS = {
    "dropout-in": (lambda m: pd.AutoDropout(m, dropout_rate=_hidden_rates(m, 0.1, 0.1)), 1e-2),
    "dropout": (lambda m: pd.AutoDropout(m, dropout_rate=_hidden_rates(m, 0.1, 0.0)), 1e-2),
    "dropout-lr3": (lambda m: pd.AutoDropout(m, dropout_rate=_hidden_rates(m, 0.1, 0.0)), 1e-3),
    "concrete-old": (
        lambda m: pd.AutoConcreteDropout(m, init_rate=0.1, temperature=0.1),
        1e-2,
    ),
    "concrete-old-lr3": (
        lambda m: pd.AutoConcreteDropout(m, init_rate=0.1, temperature=0.1),
        1e-3,
    ),
    "concrete-t2/3": (
        lambda m: pd.AutoConcreteDropout(m, init_rate=0.1, temperature=2 / 3),
        1e-2,
    ),
    "concrete-p.2": (
        lambda m: pd.AutoConcreteDropout(m, init_rate=0.2, temperature=0.1),
        1e-2,
    ),
    "concrete": (lambda m: pd.AutoConcreteDropout(m), 1e-2),
    "concrete-s.01": (lambda m: pd.AutoConcreteDropout(m, scale=0.01), 1e-2),
    "concrete-s.02": (lambda m: pd.AutoConcreteDropout(m, scale=0.02), 1e-2),
    "concrete-s.03": (lambda m: pd.AutoConcreteDropout(m, scale=0.03), 1e-2),
    "concrete-min.05": (lambda m: pd.AutoConcreteDropout(m, min_rate=0.05), 1e-2),
    "concrete-s.05": (lambda m: pd.AutoConcreteDropout(m, scale=0.05), 1e-2),
    "concrete-s.1": (lambda m: pd.AutoConcreteDropout(m, scale=0.1), 1e-2),
    "meanfield": (lambda m: pd.AutoMeanField(m), 1e-2),
    "meanfield-lr3": (lambda m: pd.AutoMeanField(m), 1e-3),
}
UCI_SMALL = ("bostonHousing", "concrete", "energy", "wine-quality-red", "yacht")


def _diabetes(k):
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    idx = np.random.default_rng(k).permutation(len(y))
    cut = int(0.9 * len(y))
    tr, te = idx[:cut], idx[cut:]
    mx, sx, my, sy = x[tr].mean(0), x[tr].std(0), y[tr].mean(), y[tr].std()
    t = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    return (
        t((x[tr] - mx) / sx),
        t((y[tr] - my) / sy),
        t((x[te] - mx) / sx),
        t((y[te] - my) / sy),
        sy,
    )


def _uci(name, k, root):
    from pyro_dropout.datasets import load_uci

    ds = load_uci(name, root)
    s = ds.split_arrays(k)
    return s.x_train, s.y_train, s.x_test, s.y_test, float(s.standardizer.y_std)


def held_out_ll(data, config, steps, seed):
    """Test log-likelihood per point, original units, of one fit."""
    x, y, xt, yt, y_std = data
    make, lr = CONFIGS[config]
    model = pd.BayesianMLP(x.shape[1], 1, hidden=(50,))
    guide = make(model)
    pd.fit(model, guide, x, y, num_steps=steps, batch_size=128, lr=lr, progress=False, seed=seed)
    pred = pd.predict(model, guide, xt, num_samples=200, seed=0)
    return float(pred.log_likelihood(yt.reshape(-1)).mean()) - math.log(y_std)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="dropout-in,dropout,concrete-old,concrete,meanfield")
    ap.add_argument("--datasets", default="diabetes," + ",".join(UCI_SMALL))
    ap.add_argument("--splits", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--uci",
        default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "uci"),
        help="the UCI folder (default: ../shared/data/uci beside the repository)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    configs = args.configs.split(",")
    print(f"steps {args.steps}, splits {args.splits}; test LL per point (original units)")
    print("| data set | " + " | ".join(configs) + " |")
    print("| --- |" + " --- |" * len(configs))
    for name in args.datasets.split(","):
        cells = []
        for config in configs:
            lls = []
            for k in range(args.splits):
                data = _diabetes(k) if name == "diabetes" else _uci(name, k, args.uci)
                t0 = time.perf_counter()
                lls.append(held_out_ll(data, config, args.steps, seed=k))
                print(f"  {name} {config} split {k}: {lls[-1]:.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
            se = np.std(lls, ddof=1) / math.sqrt(len(lls)) if len(lls) > 1 else float("nan")
            cells.append(f"{np.mean(lls):.3f} ± {se:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

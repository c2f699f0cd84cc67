"""A/B timing of two checkouts on the rows of the speed benchmark that moved, one fresh
process per measurement (used for docs/benchmarks/speed.md: between-process noise vs code).

    git worktree add --detach ../speed-a <old> && git worktree add --detach ../speed-b <new>
    for i in 1 2 3; do for c in a b; do
        PYTHONPATH=../speed-$c python tools/speed_ab.py --rounds 7; done; done

Prints the W1 default-predict ratio and the W2 variational-dropout JIT step ratio of the
checkout on ``PYTHONPATH`` (same functions and baselines as
``benchmarks.speed``).
"""

import argparse
import statistics

import pyro
import torch

from benchmarks import speed as S
from pyro_dropout import AutoDropout, AutoVariationalDropout, predict


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    pyro.enable_validation(False)
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    w1, w2 = S.WORKLOADS["W1"], S.WORKLOADS["W2"]
    x1, y1 = S._data(w1, 0)
    _, net = S._plain_step_fn(w1, x1, y1)
    step, model, guide = S._guide_step_fn(w1, AutoDropout, x1, y1)
    step()
    xp = torch.randn(1000, w1["sizes"][0])
    x2, y2 = S._data(w2, 0)
    vd_jit = S._guide_step_fn(w2, AutoVariationalDropout, x2, y2, jit=True)[0]
    vd_jit()
    fns = {
        "W1 plain predict": (S._plain_predict_fn(net, xp, 100), 5),
        "W1 predict": (lambda: predict(model, guide, xp, num_samples=100), 5),
        "W2 plain step": (S._plain_step_fn(w2, x2, y2)[0], 30),
        "W2 VD JIT step": (vd_jit, 30),
    }
    for fn, _ in fns.values():
        S._timeit(fn, 3)
    times = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, (fn, reps) in fns.items():
            times[k].append(S._timeit(fn, reps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"W1 predict {med['W1 predict'] / med['W1 plain predict']:.2f}x  "
        f"W2 VD JIT step {med['W2 VD JIT step'] / med['W2 plain step']:.2f}x"
    )


if __name__ == "__main__":
    main()

"""Time to first step (issue 38): a default ``fit`` of the speed benchmark's W1 network
(AutoDropout, 3,000 steps of batch 32, set-up and compilation included) against 3,000 steps of
the plain ``nn.Dropout`` loop, in this fresh process (the fit is the process's first: nothing
compiled or cached before it).

    PYTHONPATH=<tree> python tools/time_to_first_step.py

Prints one line: fit seconds, plain seconds, their ratio. Alternate fresh processes between
trees for an A/B. A measuring aid, not a test.
"""

import time

import pyro
import torch

from benchmarks import speed
from pyro_dropout import AutoDropout, fit

STEPS = 3000


def main():
    torch.set_num_threads(1)
    w = speed.WORKLOADS["W1"]
    x, y = speed._data(w)
    pyro.set_rng_seed(0)
    model = speed._bayesian_mlp(w)
    guide = AutoDropout(model, dropout_rate=w["p"])
    t0 = time.perf_counter()
    fit(model, guide, x, y, num_steps=STEPS, batch_size=w["batch"], progress=False, seed=0)
    fit_s = time.perf_counter() - t0
    plain, _, _ = speed._plain_step_fn(w, x, y)
    t0 = time.perf_counter()
    for _ in range(STEPS):
        plain()
    plain_s = time.perf_counter() - t0
    print(f"fit {fit_s:.2f} s, plain {plain_s:.2f} s, ratio {fit_s / plain_s:.2f}")


if __name__ == "__main__":
    main()

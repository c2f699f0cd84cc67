"""The floor of a W1 training step: the same estimator as fit's default step, hand-written in
plain PyTorch (no Pyro, no handlers), against the speed benchmark's plain ``nn.Dropout`` step.

    python tools/w1_floor.py [--rounds 7]

W1 is the speed benchmark's 8-50-1 regression at batch 32 (``benchmarks/speed.py``). The
hand-written steps compute what fit's compiled loss computes for ``BayesianMLP(8, 1,
hidden=(50,), tau=10)`` under ``local_reparameterization()``: MC dropout (input masks, the slab
noise σε of ``BernoulliMaskedNormal`` as a pre-activation variance σ²‖x‖², its KL's weight
decay) and mean-field Gaussian (pre-activation mean and variance, two products per layer,
closed-form Normal KL), a Gaussian likelihood scaled by N / B, one fused Adam. Each is timed
eager and as a TorchScript trace. Prints one line per method: the median ratio to the plain
step over interleaved rounds. A measuring aid for the speed page, not a test.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from pyro_dropout.benchmarks import speed

N, B, TAU, KEEP, SLAB2 = 1000, 32, 10.0, 0.9, 1e-4


def _dropout_loss(x, y, m1, b1, m2, b2):
    def layer(h, m, b):
        mean = F.linear(h * (torch.rand_like(h) < KEEP), m, b)
        var = SLAB2 * (h * h).sum(-1, keepdim=True) + SLAB2
        return mean + var.sqrt() * torch.randn_like(mean)

    f = layer(torch.relu(layer(x, m1, b1)), m2, b2).squeeze(-1)
    data = (-0.5 * TAU * (y - f) ** 2).sum() * (N / B)
    kl = 0.5 * KEEP * (m1.pow(2).sum() + m2.pow(2).sum()) + 0.5 * (
        b1.pow(2).sum() + b2.pow(2).sum()
    )
    return kl - data


def _mean_field_loss(x, y, m1, r1, c1, s1, m2, r2, c2, s2):
    def layer(h, m, r, c, s):
        mean = F.linear(h, m, c)
        var = F.linear(h * h, F.softplus(r) ** 2, F.softplus(s) ** 2)
        return mean + var.sqrt() * torch.randn_like(mean)

    def kl(m, r):
        sd = F.softplus(r)
        return (0.5 * (sd * sd + m * m) - sd.log()).sum()

    f = layer(torch.relu(layer(x, m1, r1, c1, s1)), m2, r2, c2, s2).squeeze(-1)
    data = (-0.5 * TAU * (y - f) ** 2).sum() * (N / B)
    return kl(m1, r1) + kl(c1, s1) + kl(m2, r2) + kl(c2, s2) - data


def _params(mean_field):
    g = torch.Generator().manual_seed(0)
    shapes = [(50, 8), (50,), (1, 50), (1,)]
    params = []
    for shape in shapes:
        params.append(torch.nn.Parameter(0.1 * torch.randn(shape, generator=g)))
        if mean_field:
            params.append(torch.nn.Parameter(torch.full(shape, -5.0)))
    return params  # mean-field: m1, r1, c1, s1, m2, r2, c2, s2


def _step(loss_fn, params, x, y, traced):
    fn = torch.jit.trace(loss_fn, (x, y, *params), check_trace=False) if traced else loss_fn
    opt = torch.optim.Adam(params, 1e-3, fused=True)

    def step():
        opt.zero_grad()
        fn(x, y, *params).backward()
        opt.step()

    return step


def _timeit(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=500)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    w = speed.WORKLOADS["W1"]
    x, y = speed._data(w)
    x, y = x[:B], y[:B]
    plain, _, _ = speed._plain_step_fn(w, *speed._data(w))
    methods = {}
    for name, loss_fn, mf in (
        ("MC dropout", _dropout_loss, False),
        ("mean-field", _mean_field_loss, True),
    ):
        for traced in (False, True):
            label = f"hand-written {name}, {'traced' if traced else 'eager'}"
            methods[label] = _step(loss_fn, _params(mf), x, y, traced)
    ratios = {k: [] for k in methods}
    for fn in [plain, *methods.values()]:
        _timeit(fn, 50)  # warm up (and the traces' profiling runs)
    for _ in range(args.rounds):
        base = _timeit(plain, args.reps)
        for k, fn in methods.items():
            ratios[k].append(_timeit(fn, args.reps) / base)
    for k, v in ratios.items():
        print(f"{k}: {statistics.median(v):.2f}x the plain step (rounds: "
              + ", ".join(f"{r:.2f}" for r in v) + ")")  # fmt: skip


if __name__ == "__main__":
    main()

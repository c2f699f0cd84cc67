"""The floor of a training step: the same estimator as fit's default step, hand-written in
plain PyTorch (no Pyro, no handlers), against the speed benchmark's plain ``nn.Dropout`` step.

    PYTHONPATH=. python tools/step_floor.py [--workload W1|W2] [--rounds 7]

The workloads are the speed benchmark's (``benchmarks/speed.py``): W1 an 8-50-1 regression at
batch 32, W2 a 784-400-400-10 classification at batch 128. The hand-written steps compute what
fit's compiled loss computes for the benchmark's ``BayesianMLP`` under
``local_reparameterization()``: MC dropout (input masks, the slab noise σε of
``BernoulliMaskedNormal`` as a pre-activation variance σ²‖x‖², its KL's weight decay),
mean-field Gaussian (pre-activation mean and variance, two products per layer, closed-form
Normal KL), variational dropout (``AutoVariationalDropout``'s default ``alpha="weight"``:
the weights' log σ² learned directly, σ² = exp(log σ²), Molchanov et al.'s additive
parameterisation; with the benchmark's Normal prior its KL is the closed-form Normal one;
biases mean-field) and Concrete dropout with one learned rate per layer (``AutoConcreteDropout``'s
default: relaxed keep masks per example and input unit, the layer's output scaled by
1 / (1 - p), Gal, Hron & Kendall's KL with its entropy term, the rate through a sigmoid), a
Gaussian (W1) or categorical (W2) likelihood scaled by N / B, and fit's Adam (``--optimizer
flat``, the default: one flat buffer, ``infer/flat_adam.py``, fused kernel as in fit; ``torch``: ``Adam(fused=True)``,
the floors' optimiser before 2026-11-29). Each is timed eager and as a TorchScript trace; ``--fit AutoConcreteDropout,...`` times fit's default step
of those guides in the same rounds. Prints one line per method: the median ratio to the plain
step over interleaved rounds. A measuring aid for the speed page, not a test.
"""

import argparse
import statistics
import time

import pyro
import torch
import torch.nn.functional as F

from benchmarks import speed
from pyro_dropout.infer.flat_adam import FlatAdam, flat_adam_args

TAU, SLAB2 = 10.0, 1e-4
TEMPERATURE, INIT_RATE = 0.1, 0.1  # AutoConcreteDropout's defaults
EPS = torch.finfo(torch.float32).eps


def _data_term(f, y, task, scale):
    if task == "regression":
        return (-0.5 * TAU * (y - f.squeeze(-1)) ** 2).sum() * scale
    return -F.cross_entropy(f, y, reduction="sum") * scale


def _dropout_loss(keep, task, scale):
    def loss(x, y, *params):
        h = x
        layers = list(zip(params[0::2], params[1::2], strict=True))
        for i, (m, b) in enumerate(layers):
            mean = F.linear(h * (torch.rand_like(h) < keep), m, b)
            var = SLAB2 * (h * h).sum(-1, keepdim=True) + SLAB2
            h = mean + var.sqrt() * torch.randn_like(mean)
            if i < len(layers) - 1:
                h = torch.relu(h)
        kl = 0.5 * keep * sum(m.pow(2).sum() for m in params[0::2])
        kl = kl + 0.5 * sum(b.pow(2).sum() for b in params[1::2])
        return kl - _data_term(h, y, task, scale)

    return loss


def _gaussian_loss(task, scale, weight):
    """A Gaussian family's step: pre-activation mean and variance (two products per layer),
    closed-form Normal KLs; ``weight(m, r)`` gives the weights' variance and KL from their mean
    and second parameter, biases are mean-field (softplus scales)."""

    def loss(x, y, *params):
        h = x
        layers = list(zip(*(params[i::4] for i in range(4)), strict=True))
        kl = 0.0
        for i, (m, r, c, s) in enumerate(layers):
            var_w, kl_w = weight(m, r)
            sd_b = F.softplus(s)
            mean = F.linear(h, m, c)
            var = F.linear(h * h, var_w, sd_b * sd_b)
            h = mean + var.sqrt() * torch.randn_like(mean)
            if i < len(layers) - 1:
                h = torch.relu(h)
            kl = kl + kl_w + (0.5 * (sd_b * sd_b + c * c) - sd_b.log()).sum()
        return kl - _data_term(h, y, task, scale)

    return loss


def _softplus_weight(m, r):
    """Mean-field: σ = softplus(ρ)."""
    sd = F.softplus(r)
    return sd * sd, (0.5 * (sd * sd + m * m) - sd.log()).sum()


def _log_variance_weight(m, log_var):
    """VD, ``alpha="weight"``: log σ² learned directly."""
    var = log_var.exp()
    return var, 0.5 * (var + m * m - log_var).sum()


def _concrete_loss(task, scale):
    def loss(x, y, *params):
        h = x
        layers = list(zip(params[0::3], params[1::3], params[2::3], strict=True))
        kl = 0.0
        for i, (m, b, rho) in enumerate(layers):
            p = torch.sigmoid(rho).clamp(EPS, 1 - EPS)
            s = -1.0 / TEMPERATURE  # keep mask σ(-(logit p + logit u) / t), as concrete_keep_mask
            noise = torch.logit(torch.rand_like(h), eps=EPS)
            z = torch.sigmoid(torch.add(torch.logit(p) * s, noise, alpha=s))
            mean = torch.addcmul(b, F.linear(h * z, m), torch.reciprocal(1 - p))
            var = SLAB2 * (h * h).sum(-1, keepdim=True) + SLAB2
            h = mean + var.sqrt() * torch.randn_like(mean)
            if i < len(layers) - 1:
                h = torch.relu(h)
            entropy = p * torch.log(p) + (1 - p) * torch.log1p(-p)
            kl = kl + 0.5 * m.pow(2).sum() / (1 - p) + m.shape[1] * entropy
            kl = kl + 0.5 * b.pow(2).sum()
        return kl - _data_term(h, y, task, scale)

    return loss


def _params(sizes, kind):
    g = torch.Generator().manual_seed(0)
    params = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        for shape in ((b, a), (b,)):
            params.append(torch.nn.Parameter(0.1 * torch.randn(shape, generator=g)))
            if kind == "mean-field":  # per layer: weight mean, weight ρ, bias mean, bias ρ
                params.append(torch.nn.Parameter(torch.full(shape, -5.0)))
            elif kind == "VD":  # per layer: weight mean, weight log σ², bias mean, bias ρ
                init = torch.full(shape, -5.0 if len(shape) == 1 else -10.0)
                params.append(torch.nn.Parameter(init))
        if kind == "Concrete dropout":  # per layer: mean weight, bias mean, logit of the rate
            rho = torch.logit(torch.tensor(INIT_RATE))
            params.append(torch.nn.Parameter(rho))
    return params


def _step(loss_fn, params, x, y, traced, optimizer="flat"):
    fn = torch.jit.trace(loss_fn, (x, y, *params), check_trace=False) if traced else loss_fn
    if optimizer == "flat":  # fit's optimiser since 2026-11-29: Adam on one flat buffer
        fn(x, y, *params).backward()
        flat = FlatAdam(params, flat_adam_args(torch.optim.Adam, {"lr": 1e-3}), fused=True)

        def step():
            flat.zero_grad()
            fn(x, y, *params).backward()
            flat.step()

        return step
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
    p.add_argument("--workload", choices=sorted(speed.WORKLOADS), default="W1")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=None, help="steps per timing (W1 500, W2 20)")
    p.add_argument("--fit", default="", help="also fit's default step of these guides")
    p.add_argument(
        "--optimizer",
        choices=["flat", "torch"],
        default="flat",
        help="the hand-written steps' Adam: fit's flat one (default) or torch.optim.Adam(fused)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    w = speed.WORKLOADS[args.workload]
    reps = args.reps or (500 if args.workload == "W1" else 20)
    x, y = speed._data(w)
    plain, _, _ = speed._plain_step_fn(w, x, y)
    xb, yb = x[: w["batch"]], y[: w["batch"]]
    scale = w["n_data"] / w["batch"]
    losses = {
        "MC dropout": _dropout_loss(1 - w["p"], w["task"], scale),
        "mean-field": _gaussian_loss(w["task"], scale, _softplus_weight),
        "Concrete dropout": _concrete_loss(w["task"], scale),
        "VD": _gaussian_loss(w["task"], scale, _log_variance_weight),
    }
    methods = {}
    for name, loss_fn in losses.items():
        for traced in (False, True):
            label = f"{args.workload} hand-written {name}, {'traced' if traced else 'eager'}"
            methods[label] = _step(
                loss_fn, _params(w["sizes"], name), xb, yb, traced, args.optimizer
            )
    for guide in filter(None, args.fit.split(",")):
        pyro.set_rng_seed(0)
        methods[f"{args.workload} fit's step, {guide}"] = speed._fit_step(w, guide, x, y)
    for fn in [plain, *methods.values()]:
        _timeit(fn, 5)  # warm up (and the traces' profiling runs)
    ratios = {k: [] for k in methods}
    for _ in range(args.rounds):
        base = _timeit(plain, reps)
        for k, fn in methods.items():
            ratios[k].append(_timeit(fn, reps) / base)
    for k, v in ratios.items():
        print(f"{k}: {statistics.median(v):.2f}x the plain step (rounds: "
              + ", ".join(f"{r:.2f}" for r in v) + ")")  # fmt: skip


if __name__ == "__main__":
    main()

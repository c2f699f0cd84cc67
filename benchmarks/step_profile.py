"""Where one training step's time goes, and how close it is to the hardware: the phases of a
step by differences of timed prefixes, its matrix-product FLOPs, and a matmul peak measured in
the same process (used by :mod:`benchmarks.speed`).

Phases of an eager step (``SVI.step`` with :class:`~pyro_dropout.infer.MeanFieldELBO` under
``local_reparameterization()``), each the difference of two medians:

* ``guide``: ``poutine.trace(guide)`` (the guide's sample sites, its parameters' transforms);
* ``model + LRT``: the model replayed against the guide trace, with the local-
  reparameterisation messenger (Pyro's handler stack, the layers, the pre-activation draws);
* ``ELBO terms``: the analytic KLs and the observed sites' log densities;
* ``backward``: ``loss.backward()``;
* ``optimiser + SVI``: the rest of ``SVI.step`` (parameter capture, the fused Adam step, zeroing
  the gradients).

A compiled step has three: ``loss graph`` (the traced forward, with Pyro's parameter plumbing),
``backward`` and ``optimiser + SVI``. Prefix differences are not exact (timings overlap caches
and the allocator), so the phases add up to the step only approximately.
"""

from __future__ import annotations

import statistics
import time

import torch
from pyro import poutine
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["matmul_peak_gflops", "phases", "step_flops", "synchronize"]


def synchronize():
    """Wait for queued GPU work (a no-op without CUDA): timers read the host clock."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median_ms(fn, reps, rounds=5):
    fn()
    times = []
    for _ in range(rounds):
        synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize()
        times.append((time.perf_counter() - t0) / reps)
    return 1e3 * statistics.median(times)


def matmul_peak_gflops(n=512, reps=20):
    """GFLOP/s of an ``n × n`` by ``n × n`` float32 matrix product on this process's threads:
    the practical arithmetic ceiling of a step (2n³ FLOPs per product)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = _median_ms(lambda: a @ b, reps)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def step_flops(fn):
    """Matrix-product FLOPs (forward and backward) of one call of ``fn`` (``torch``'s
    ``FlopCounterMode``: matmul, bmm, addmm, convolutions; element-wise work is not counted)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def phases(model, guide, elbo, svi_step, args, kwargs, context, reps, compiled):
    """Milliseconds per phase of one training step (module docs). ``svi_step()`` is the whole
    step; ``context()`` a fresh context manager to run each piece under (LRT, scaling)."""
    params = None

    def zero():
        nonlocal params
        if params is None:
            params = [p for p in guide.parameters()] + [p for p in model.parameters()]
        for p in params:
            p.grad = None

    def run(fn):
        def call():
            with context():
                return fn()

        return call

    def loss():
        return elbo.differentiable_loss(model, guide, *args, **kwargs)

    def loss_backward():
        loss().backward()
        zero()

    t_loss = _median_ms(run(loss), reps)
    t_backward = _median_ms(run(loss_backward), reps)
    t_step = _median_ms(svi_step, reps)
    out = {}
    if not compiled:

        def guide_only():
            return poutine.trace(guide).get_trace(*args, **kwargs)

        def guide_model():
            tr = guide_only()
            return poutine.trace(poutine.replay(model, trace=tr)).get_trace(*args, **kwargs)

        t_guide = _median_ms(run(guide_only), reps)
        t_model = _median_ms(run(guide_model), reps)
        out["guide"] = t_guide
        out["model + LRT"] = t_model - t_guide
        out["ELBO terms"] = t_loss - t_model
    else:
        out["loss graph"] = t_loss
    out["backward"] = t_backward - t_loss
    out["optimiser + SVI"] = t_step - t_backward
    out["step"] = t_step
    return out

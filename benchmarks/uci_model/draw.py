"""One vectorised Monte-Carlo draw of the members' predictions (eager or captured)."""

from __future__ import annotations

import time

import pyro
import torch
from pyro import poutine

from pyro_dropout.infer.capture import CapturedFunction


class _Draw:
    """One vectorised Monte-Carlo draw ``f`` of shape ``(c, M, N)``: the guide traced once, the
    model replayed on it block by block of ``rows`` rows. Blocks keep each replay cache-sized.

    * ``draws="weights"``: every block reads the guide's weight draws, so one pass applies one
      draw of the weights to all rows, as in one full pass;
    * ``draws="examples"``: under ``local_reparameterization()`` each replay draws fresh
      pre-activations per example (the guide's weight draws are unused), so the blocks are
      independent draws exactly as in one full pass.

    With ``jit``, one capture per ``(c, input shape, rows)``
    (:class:`~pyro_dropout.infer.capture.CapturedFunction`): the replayed graph draws fresh
    random numbers on each call but skips Pyro's Python-level effect handling."""

    def __init__(self, model, guide, jit):
        self.model, self.guide, self.jit = model, guide, jit
        self._compiled = {}
        self.compile_s = 0.0
        self.compile_samples = 0

    def _eager(self, x, c, rows):
        m, n = x.shape[0], x.shape[1]
        with pyro.plate("_mc_samples", c, dim=-3):
            trace = poutine.trace(self.guide).get_trace(x[:, :rows])
            model = poutine.replay(self.model, trace=trace)
            tail = (2,) if getattr(self.model, "heteroscedastic", False) else ()
            parts = [
                model(x[:, r0 : r0 + rows]).reshape(c, m, -1, *tail) for r0 in range(0, n, rows)
            ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)

    def __call__(self, x, c, rows):
        if not self.jit:
            return self._eager(x, c, rows)
        key = (c, tuple(x.shape), rows)
        fn = self._compiled.get(key)
        first = fn is None
        if first:
            fn = self._compiled[key] = CapturedFunction(lambda x: self._eager(x, c, rows))
            t0 = time.perf_counter()
        f = fn(x)
        if first:
            self.compile_s += time.perf_counter() - t0
            self.compile_samples += c
        return f

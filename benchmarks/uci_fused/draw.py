"""Monte-Carlo passes of weight draws through the forward kernel."""

from __future__ import annotations

import pyro

from .kernels import as_array, compiled, constants
from .support import SITES, predict_unsupported_reason


class FusedDraw:
    """Monte-Carlo passes of :func:`~benchmarks.uci_model.evaluate` with one
    weight draw per pass (``draws="weights"``): the guide's weights drawn as the traced draw
    draws them (the guide traced under a plate of ``c`` samples), the network's forward on
    every row in one numba kernel. Why: on kin8nm's 240 validation members the traced pass
    (blocks of 74 rows, a (240, 74, 8) x (240, 8, 50) product, a bias, a ReLU per block) took
    68 ms, bound by those small products and element-wise passes.

    Same call as the traced draw, ``draw(x, c, rows)`` → ``f`` ``(c, M, N)``; ``rows`` is
    ignored (the kernel streams the rows)."""

    def __init__(self, model, guide):
        reason = predict_unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FusedDraw cannot draw for this model: {reason}")
        self.model, self.guide = model, guide
        self.compile_s, self.compile_samples = 0.0, 0

    def __call__(self, x, c, rows=None):
        with pyro.plate("_mc_samples", c, dim=-3):
            trace = pyro.poutine.trace(self.guide).get_trace(x[:, :1])
        w = [trace.nodes[name]["value"] for name in SITES]
        members, d = x.shape[0], x.shape[2]
        hidden = self.model.layers[0].out_features
        # the kernel's layout (see inputs.by_layer), with the draws in front
        w1 = w[0].reshape(c, members, hidden, d).transpose(2, 3)
        b1 = w[1].reshape(c, members, hidden)
        w2, b2 = w[2].reshape(c, members, hidden), w[3].reshape(c, members)
        f = x.new_empty(c, members, x.shape[1])
        arrays = [as_array(t) for t in (x, w1, b1, w2, b2)]
        compiled()["predict"](*arrays, constants(x), f.numpy())
        return f

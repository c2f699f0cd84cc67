r"""Fused training loss of the UCI engine's members (numba kernels): mean-field, variational
dropout, MC dropout and Concrete dropout.

Why our own: the batched validation step (240 members × 128 rows through 8-50-1) is bound by
element-wise passes over ``(M, B, H)`` tensors, not by its matrix products. Run as the traced
Pyro loss, local reparameterisation, the ReLU, the output layer's two products (with
``K = 1`` or ``N = 1``) and their backward take about 25 passes over each 6 MB tensor; this
torch build has no CPU fuser (TorchScript's NNC: "LLVM Backend not found"), and
``torch.compile`` cannot trace Pyro's effect handlers (``docs/benchmarks/speed.md``). Here
one numba kernel draws the whole D-H-1 network's pre-activations (the first layer's
products, the noise, the ReLU, the output layer) in one pass over the rows, and one more
accumulates every gradient: kin8nm's 240-member mean-field step 44 → 18 ms
(``docs/benchmarks/uci.md``).

The loss is the negative ELBO of :class:`~pyro_dropout.infer.MeanFieldELBO` on
:class:`~benchmarks.uci_model.BatchedRegressionMLP` under
:func:`~pyro_dropout.local_reparameterization`. For the Gaussian guides
(:class:`~pyro_dropout.AutoMeanField`, :class:`~pyro_dropout.AutoVariationalDropout`):

.. math::

    a = x μ_1^⊤ + μ_{b_1} + \sqrt{\max(x^2 σ_1^{2⊤} + σ_{b_1}^2, \varepsilon)}\, ξ_1,\quad
    h = \max(a, 0),\quad
    f = h μ_2^⊤ + μ_{b_2} + \sqrt{\max(h^2 σ_2^{2⊤} + σ_{b_2}^2, \varepsilon)}\, ξ_2,

    \mathcal L = \sum_{\text{sites}} \mathrm{KL}(q \,\|\, p)
        - \frac{N}{B} \sum_{m, i} \log \mathcal N(y_{mi} \mid f_{mi}, s_m^2),

with ξ ~ N(0, 1) (by the kernels' ``fill_normal``: Box–Muller on a counter-based stream,
or by torch's generator with ``rng="torch"``; ``ε`` the variance floor of
:data:`~pyro_dropout.handlers.lrt_rules.VARIANCE_FLOOR`). For
:class:`~pyro_dropout.AutoDropout` (:math:`W = M \operatorname{diag}(z) + σε`) each layer's
input is masked per row, :math:`a = (x \odot z_1) M_1^⊤ + μ_{b_1} + σ\sqrt{\sum x^2 + 1}\,ξ_1`,
and likewise for the output layer; :class:`~pyro_dropout.AutoConcreteDropout` likewise with
relaxed masks and each layer's output scaled by :math:`1/(1-p)`. Given the same masks and
noise it is the Pyro loss to rounding, value and gradients
(``tests/bench/test_uci_fused.py``).

Modules, one concept each: :mod:`.kernels` (the numba kernels), :mod:`.networks` (the
kernels as autograd Functions), :mod:`.inputs` (their inputs and random draws),
:mod:`.closed_form_kl` and :mod:`.likelihood` (the loss's terms), :mod:`.loss` (the loss
under autograd), :mod:`.gradients` (the loss's gradients by hand), :mod:`.svi` (a training
step), :mod:`.draw` (Monte-Carlo weight draws) and :mod:`.support` (what they apply to).
"""

from .draw import FusedDraw
from .kernels import available
from .loss import fused_loss
from .support import (
    FUSED_GUIDES,
    predict_supports,
    predict_unsupported_reason,
    supports,
    unsupported_reason,
)
from .svi import FusedSVI

__all__ = [
    "FUSED_GUIDES",
    "FusedDraw",
    "FusedSVI",
    "available",
    "fused_loss",
    "predict_supports",
    "predict_unsupported_reason",
    "supports",
    "unsupported_reason",
]

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
:class:`~pyro_dropout.benchmarks.uci_model.BatchedRegressionMLP` under
:func:`~pyro_dropout.local_reparameterization`. For the Gaussian guides
(:class:`~pyro_dropout.AutoMeanField`, :class:`~pyro_dropout.AutoVariationalDropout`):

.. math::

    a = x μ_1^⊤ + μ_{b_1} + \sqrt{\max(x^2 σ_1^{2⊤} + σ_{b_1}^2, \varepsilon)}\, ξ_1,\quad
    h = \max(a, 0),\quad
    f = h μ_2^⊤ + μ_{b_2} + \sqrt{\max(h^2 σ_2^{2⊤} + σ_{b_2}^2, \varepsilon)}\, ξ_2,

    \mathcal L = \sum_{\text{sites}} \mathrm{KL}(q \,\|\, p)
        - \frac{N}{B} \sum_{m, i} \log \mathcal N(y_{mi} \mid f_{mi}, s_m^2),

with ξ ~ N(0, 1) drawn by torch's generator (``ε`` the variance floor of
:data:`~pyro_dropout.handlers.lrt_rules.VARIANCE_FLOOR`). For
:class:`~pyro_dropout.AutoDropout` (:math:`W = M \operatorname{diag}(z) + σε`) each layer's
input is masked per row, :math:`a = (x \odot z_1) M_1^⊤ + μ_{b_1} + σ\sqrt{\sum x^2 + 1}\,ξ_1`,
and likewise for the output layer; :class:`~pyro_dropout.AutoConcreteDropout` likewise with
relaxed masks and each layer's output scaled by :math:`1/(1-p)`. Given the same masks and
noise it is the Pyro loss to rounding, value and gradients
(``tests/benchmarks/test_uci_fused.py``).
"""

from __future__ import annotations

import math

import pyro
import torch
import torch.nn.functional as F
from torch.distributions import Independent, Normal, kl_divergence, transform_to

from .._broadcast import unexpand
from ..distributions import BernoulliMaskedNormal
from ..distributions import kl as _kl
from ..guides import AutoConcreteDropout, AutoDropout, AutoMeanField, AutoVariationalDropout
from ..guides.base import _deep_getattr
from ..handlers.lrt_rules import VARIANCE_FLOOR

__all__ = [
    "FUSED_GUIDES",
    "FusedDraw",
    "FusedSVI",
    "available",
    "fused_loss",
    "predict_supports",
    "supports",
    "unsupported_reason",
]

try:  # optional: the benchmark's extra (``pip install pyro-dropout[benchmarks]``)
    import numba
    import numpy as np
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

_SITES = ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias")
_GUIDES = (AutoMeanField, AutoVariationalDropout, AutoDropout, AutoConcreteDropout)
#: The UCI benchmark's guides (``uci_model.GUIDES``) that train on the kernels.
FUSED_GUIDES = ("meanfield", "vd", "dropout", "concrete", "concrete-tau")


def available():
    """Whether numba is installed (the fused kernels need it)."""
    return numba is not None


def unsupported_reason(model, guide):
    """Why the fused loss cannot train ``(model, guide)``, or ``None`` when it can."""
    if numba is None:
        return "numba is not installed (pip install 'pyro-dropout[benchmarks]')"
    if type(guide) not in _GUIDES:
        return (
            "the fused loss is written for AutoMeanField, AutoVariationalDropout, AutoDropout "
            f"and AutoConcreteDropout, not {type(guide).__name__}"
        )
    if type(guide) is AutoDropout and (guide.learn_scale or isinstance(guide.dropout_rate, dict)):
        return "the fused AutoDropout loss needs a fixed slab scale and one rate for all layers"
    if type(guide) is AutoConcreteDropout and guide.rate_per != "layer":
        return "the fused AutoConcreteDropout loss needs one rate per layer (rate_per='layer')"
    if getattr(model, "heteroscedastic", True):
        return "the fused loss has one output (no heteroscedastic head)"
    if len(model.layers) != 2 or model.layers[1].out_features != 1:
        return "the fused loss is written for D-H-1 networks"
    return None


def supports(model, guide):
    """Whether :func:`fused_loss` can train ``(model, guide)``."""
    return unsupported_reason(model, guide) is None


# ---------------------------------------------------------------------------------- kernels
_KERNELS = {}


def _kernels():
    """The two kernels, compiled at first use (and cached on disk by numba)."""
    if not _KERNELS:
        jit = numba.njit(fastmath=True, cache=True, error_model="numpy", nogil=True)

        # Branch-free inner loops over the hidden units (selects, not jumps), so that LLVM
        # vectorises them; constants typed like the data (float32 stays float32). The
        # first layer's products run here too, over the hidden units (K = D is too small
        # for a matrix product to be efficient: 3 ms per (240, 128, 8) x (240, 8, 50) bmm).
        @jit
        def forward(x, w1m, w1v, b1m, b1v, eps1, m2, v2, b2m, b2v, eps2, consts, a, r, f, r2):
            # Per member and row: the hidden pre-activations a (kept for the backward), the
            # factor ξ/(2 sd) of their variance's gradient (0 where the floor holds), and
            # the output layer's mean and variance accumulated over the hidden units.
            floor, half, zero = consts[0], consts[1], consts[2]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            mean1 = np.empty(nh, dtype=a.dtype)
            var1 = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for i in range(nb):
                    for j in range(nh):
                        mean1[j] = b1m[m, j]
                        var1[j] = b1v[m, j]
                    for k in range(nd):
                        xk = x[m, i, k]
                        xk2 = xk * xk
                        for j in range(nh):
                            mean1[j] += xk * w1m[m, k, j]
                            var1[j] += xk2 * w1v[m, k, j]
                    mean = b2m[m]
                    var = b2v[m]
                    for j in range(nh):
                        v = var1[j]
                        e = eps1[m, i, j]
                        sd = np.sqrt(max(v, floor))
                        r[m, i, j] = half * e / sd if v > floor else zero
                        u = mean1[j] + sd * e
                        a[m, i, j] = u
                        h = max(u, zero)
                        mean += h * m2[m, j]
                        var += h * h * v2[m, j]
                    e = eps2[m, i]
                    sd = np.sqrt(max(var, floor))
                    r2[m, i] = half * e / sd if var > floor else zero
                    f[m, i] = mean + sd * e

        @jit
        def backward(gf, x, a, r, r2, m2, v2, consts, gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v):
            zero, two = consts[2], consts[3]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            g = np.empty(nh, dtype=a.dtype)
            gr = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for j in range(nh):
                    gb1m[m, j] = zero
                    gb1v[m, j] = zero
                    gm2[m, j] = zero
                    gv2[m, j] = zero
                    for k in range(nd):
                        gw1m[m, k, j] = zero
                        gw1v[m, k, j] = zero
                sm = zero
                sv = zero
                for i in range(nb):
                    gmean = gf[m, i]
                    gvar = gmean * r2[m, i]
                    sm += gmean
                    sv += gvar
                    for j in range(nh):
                        u = a[m, i, j]
                        h = max(u, zero)
                        gm2[m, j] += h * gmean
                        gv2[m, j] += h * h * gvar
                        gj = (gmean * m2[m, j] if u > zero else zero) + two * h * gvar * v2[m, j]
                        grj = gj * r[m, i, j]
                        g[j] = gj
                        gr[j] = grj
                        gb1m[m, j] += gj
                        gb1v[m, j] += grj
                    for k in range(nd):
                        xk = x[m, i, k]
                        xk2 = xk * xk
                        for j in range(nh):
                            gw1m[m, k, j] += xk * g[j]
                            gw1v[m, k, j] += xk2 * gr[j]
                gb2m[m] = sm
                gb2v[m] = sv

        golden = np.uint64(0x9E3779B97F4A7C15)
        mix1, mix2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
        s30, s27, s31, s40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)

        @jit
        def uniform(seed, counter, use, u, m, i, k):
            # The mask's uniform: ``u[m, i, k]`` when given (the tests' fixed draws), else
            # a counter-based draw (SplitMix64's output function of seed + counter·γ; Steele,
            # Lea & Flood 2014): 24 random bits in [0, 1), as torch's float32 ``rand``. The
            # backward recomputes the same masks from the same counters.
            if use:
                return u[m, i, k]
            z = seed + np.uint64(counter) * golden
            z = (z ^ (z >> s30)) * mix1
            z = (z ^ (z >> s27)) * mix2
            z = z ^ (z >> s31)
            return np.float32(z >> s40) * np.float32(5.9604644775390625e-08)

        # MC dropout (AutoDropout, Gal & Ghahramani's W = M diag(z) + σε): per row, a keep
        # mask on each layer's inputs (z = u < 1 - p from the uniforms u), the masked
        # inputs' product with M, and the slab noise σ² Σ x² (+ σ² for the bias) shared by
        # the row's units. σ and p are fixed, so only M and the biases get gradients. Mask
        # counters: row (m, i) owns D + H of them, the first layer's inputs then the second's.
        @jit
        def dropout_forward(
            x, seed, use, u1, keep, w1, b1, eps1, u2, w2, b2, eps2, consts, a, f, r2
        ):
            floor, half, zero, slab = consts[0], consts[1], consts[2], consts[4]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            mean1 = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for i in range(nb):
                    for j in range(nh):
                        mean1[j] = b1[m, j]
                    ss = zero
                    row = (m * nb + i) * (nd + nh)
                    for k in range(nd):
                        xk = x[m, i, k]
                        ss += xk * xk
                        xz = xk if uniform(seed, row + k, use, u1, m, i, k) < keep[m] else zero
                        for j in range(nh):
                            mean1[j] += xz * w1[m, k, j]
                    sd1 = np.sqrt(max(slab * (ss + 1), floor))
                    mean = b2[m]
                    hh = zero
                    for j in range(nh):
                        u = mean1[j] + sd1 * eps1[m, i, j]
                        a[m, i, j] = u
                        h = max(u, zero)
                        hh += h * h
                        kept = uniform(seed, row + nd + j, use, u2, m, i, j) < keep[m]
                        mean += h * w2[m, j] if kept else zero
                    var = slab * (hh + 1)
                    e = eps2[m, i]
                    sd = np.sqrt(max(var, floor))
                    r2[m, i] = half * e / sd if var > floor else zero
                    f[m, i] = mean + sd * e

        @jit
        def dropout_backward(gf, x, seed, use, u1, keep, a, u2, w2, r2, consts, gw1, gb1, gw2, gb2):
            zero, two, slab = consts[2], consts[3], consts[4]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            g = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for j in range(nh):
                    gb1[m, j] = zero
                    gw2[m, j] = zero
                    for k in range(nd):
                        gw1[m, k, j] = zero
                sm = zero
                for i in range(nb):
                    gmean = gf[m, i]
                    gvar = gmean * r2[m, i]
                    sm += gmean
                    row = (m * nb + i) * (nd + nh)
                    for j in range(nh):
                        u = a[m, i, j]
                        h = max(u, zero)
                        kept = uniform(seed, row + nd + j, use, u2, m, i, j) < keep[m]
                        gw2[m, j] += h * gmean if kept else zero
                        gh = (gmean * w2[m, j] if kept else zero) + two * slab * h * gvar
                        gj = gh if u > zero else zero
                        g[j] = gj
                        gb1[m, j] += gj
                    for k in range(nd):
                        kept = uniform(seed, row + k, use, u1, m, i, k) < keep[m]
                        xz = x[m, i, k] if kept else zero
                        for j in range(nh):
                            gw1[m, k, j] += xz * g[j]
                gb2[m] = sm

        _KERNELS["dropout_forward"] = dropout_forward
        _KERNELS["dropout_backward"] = dropout_backward

        @jit
        def predict(x, w1, b1, w2, b2, consts, f):
            # One Monte-Carlo pass per leading index t: f[t, m, i] is member m's network, with
            # the weights of draw t, on row i (weights as (c, M, D, H): contiguous in the units).
            nc, nm, nd, nh = w1.shape
            nb = x.shape[1]
            acc = np.empty(nh, dtype=w1.dtype)
            zero = consts[2]
            for t in range(nc):
                for m in range(nm):
                    for i in range(nb):
                        for j in range(nh):
                            acc[j] = b1[t, m, j]
                        for k in range(nd):
                            xk = x[m, i, k]
                            for j in range(nh):
                                acc[j] += xk * w1[t, m, k, j]
                        out = b2[t, m]
                        for j in range(nh):
                            out += max(acc[j], zero) * w2[t, m, j]
                        f[t, m, i] = out

        _KERNELS["predict"] = predict

        # Concrete dropout (AutoConcreteDropout, one learned rate per layer and member): as MC
        # dropout, with the relaxed keep masks z = σ(-(logit p + logit u) / t) (drawn by
        # torch: its vectorised logit and sigmoid; the kernels' scalar log and exp took longer
        # than the whole traced step) and the layer's output scaled by 1 / (1 - p) (the mean
        # weight m' = (1 - p) M). Gradients also for logit p (∂z/∂ logit p = -z (1 - z) / t)
        # and 1 / (1 - p) of each layer; torch chains them to p.
        @jit
        def concrete_forward(x, z1, z2, inv1, inv2, w1, b1, eps1, w2, b2, eps2, consts, a, f, r2):
            floor, half, zero, slab = consts[0], consts[1], consts[2], consts[4]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            mean1 = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for i in range(nb):
                    for j in range(nh):
                        mean1[j] = zero
                    ss = zero
                    for k in range(nd):
                        xk = x[m, i, k]
                        ss += xk * xk
                        xz = xk * z1[m, i, k]
                        for j in range(nh):
                            mean1[j] += xz * w1[m, k, j]
                    sd1 = np.sqrt(max(slab * (ss + 1), floor))
                    s2 = zero
                    hh = zero
                    for j in range(nh):
                        u = b1[m, j] + inv1[m] * mean1[j] + sd1 * eps1[m, i, j]
                        a[m, i, j] = u
                        h = max(u, zero)
                        hh += h * h
                        s2 += h * z2[m, i, j] * w2[m, j]
                    var = slab * (hh + 1)
                    e = eps2[m, i]
                    sd = np.sqrt(max(var, floor))
                    r2[m, i] = half * e / sd if var > floor else zero
                    f[m, i] = b2[m] + inv2[m] * s2 + sd * e

        @jit
        def concrete_backward(
            gf, x, z1, z2, inv1, inv2, w1, a, w2, r2, consts,
            gw1, gb1, gw2, gb2, glp1, glp2, ginv1, ginv2,
        ):  # fmt: skip
            zero, two, slab, inv_t = consts[2], consts[3], consts[4], consts[6]
            nm, nb, nh = a.shape
            nd = x.shape[2]
            g = np.empty(nh, dtype=a.dtype)
            for m in range(nm):
                for j in range(nh):
                    gb1[m, j] = zero
                    gw2[m, j] = zero
                    for k in range(nd):
                        gw1[m, k, j] = zero
                sb2 = zero
                slp1 = zero
                slp2 = zero
                sinv1 = zero
                sinv2 = zero
                for i in range(nb):
                    gmean = gf[m, i]
                    gvar = gmean * r2[m, i]
                    sb2 += gmean
                    for j in range(nh):
                        u = a[m, i, j]
                        h = max(u, zero)
                        z = z2[m, i, j]
                        hw = gmean * h * w2[m, j]
                        gw2[m, j] += gmean * inv2[m] * h * z
                        sinv2 += hw * z
                        slp2 -= inv2[m] * hw * z * (1 - z) * inv_t
                        gh = gmean * inv2[m] * z * w2[m, j] + two * slab * h * gvar
                        gj = gh if u > zero else zero
                        g[j] = gj
                        gb1[m, j] += gj
                    for k in range(nd):
                        z = z1[m, i, k]
                        xk = x[m, i, k]
                        s1 = zero  # Σ_j g_j W1[k, j]
                        for j in range(nh):
                            gw1[m, k, j] += inv1[m] * xk * z * g[j]
                            s1 += g[j] * w1[m, k, j]
                        sinv1 += xk * z * s1
                        slp1 -= inv1[m] * s1 * xk * z * (1 - z) * inv_t
                gb2[m] = sb2
                glp1[m] = slp1
                glp2[m] = slp2
                ginv1[m] = sinv1
                ginv2[m] = sinv2

        _KERNELS["concrete_forward"] = concrete_forward
        _KERNELS["concrete_backward"] = concrete_backward
        _KERNELS["forward"], _KERNELS["backward"] = forward, backward
    return _KERNELS["forward"], _KERNELS["backward"]


def _scratch(ctx, key, shape, like):
    """An uninitialised tensor of ``shape``: one kept across steps by the hand-written step's
    context (:class:`_Ctx` with ``buffers``), a new one under autograd (which may keep it).

    Why: a fresh 6 MB tensor per step is fresh pages from the kernel (a page fault and zeroing
    per 4 kB on first touch): ``torch.randn`` of (240, 128, 50) took 8.6 ms where filling a
    kept tensor with ``normal_`` took 4.3 ms."""
    buffers = getattr(ctx, "buffers", None)
    shape = torch.Size(shape)
    if buffers is None:
        return like.new_empty(shape)
    key = (key, shape, like.dtype)  # an epoch's last, smaller minibatch keeps its own
    t = buffers.get(key)
    if t is None:
        t = buffers[key] = like.new_empty(shape)
    return t


def _constants(like, slab_var=0.0, inv_temperature=0.0):
    """The kernels' constants (variance floor, 1/2, 0, 2, the slab variance σ², the clamp of
    the uniforms in ``logit u`` (the dtype's eps, as ``torch.logit(u, eps)``), 1 / t) in
    ``like``'s dtype: float32 data then runs float32 arithmetic throughout."""
    dtype = _np(like).dtype
    eps = np.finfo(dtype).eps
    return np.array([VARIANCE_FLOOR, 0.5, 0.0, 2.0, slab_var, eps, inv_temperature], dtype=dtype)


def _np(t):
    return t.detach().contiguous().numpy()


class _GaussianMLP(torch.autograd.Function):
    """The whole D-H-1 network's pre-activation draws, given the layers' means and variances
    (first layer as ``(M, D, H)``, the rest ``(M, H)`` and ``(M,)``) and the noise ξ:
    returns ``f`` ``(M, B)``. Gradients for the parameters (not for ``x`` or the noise)."""

    @staticmethod
    def forward(ctx, x, w1m, w1v, b1m, b1v, m2, v2, b2m, b2v, eps1, eps2):
        forward, _ = _kernels()
        shape = eps1.shape
        a, r = _scratch(ctx, "a", shape, x), _scratch(ctx, "r", shape, x)
        f, r2 = _scratch(ctx, "f", shape[:2], x), _scratch(ctx, "r2", shape[:2], x)
        forward(
            *map(_np, (x, w1m, w1v, b1m, b1v, eps1, m2, v2, b2m, b2v, eps2)),
            _constants(x),
            a.numpy(),
            r.numpy(),
            f.numpy(),
            r2.numpy(),
        )
        ctx.save_for_backward(x, a, r, r2, m2, v2)
        return f

    @staticmethod
    def backward(ctx, gf):
        _, backward = _kernels()
        x, a, r, r2, m2, v2 = ctx.saved_tensors
        members, _, d = x.shape
        gw1m, gw1v = (_scratch(ctx, k, (members, d, m2.shape[1]), x) for k in ("gw1m", "gw1v"))
        gb1m, gb1v, gm2, gv2 = (
            _scratch(ctx, k, m2.shape, x) for k in ("gb1m", "gb1v", "gm2", "gv2")
        )
        gb2m, gb2v = _scratch(ctx, "gb2m", (members,), x), _scratch(ctx, "gb2v", (members,), x)
        outs = (gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v)
        backward(
            _np(gf), *map(_np, (x, a, r, r2, m2, v2)), _constants(x), *(t.numpy() for t in outs)
        )
        return (None, *outs, None, None)


class _DropoutMLP(torch.autograd.Function):
    """The D-H-1 network's pre-activation draws under MC dropout, given the masks' uniforms
    (``u1`` ``(M, B, D)`` and ``u2`` ``(M, B, H)``, or ``None``: drawn inside the kernels from
    ``seed``), the normal noise, ``M`` of each layer (first as ``(M, D, H)``), the biases'
    means, the keep probabilities ``(M,)`` and σ²: returns ``f`` ``(M, B)``. Gradients for
    ``M`` and the biases' means."""

    @staticmethod
    def forward(ctx, x, seed, u1, keep, w1, b1, eps1, u2, w2, b2, eps2, slab_var):
        _kernels()
        forward = _KERNELS["dropout_forward"]
        use = u1 is not None
        if not use:  # placeholders of the right type, never read
            u1 = u2 = x.new_empty((1, 1, 1))
        a = _scratch(ctx, "a", eps1.shape, x)
        f, r2 = _scratch(ctx, "f", eps1.shape[:2], x), _scratch(ctx, "r2", eps1.shape[:2], x)
        consts = _constants(x, slab_var)
        seed = np.uint64(seed)
        x_, u1_, keep_, w1_, b1_, eps1_, u2_, w2_, b2_, eps2_ = map(
            _np, (x, u1, keep, w1, b1, eps1, u2, w2, b2, eps2)
        )
        forward(x_, seed, use, u1_, keep_, w1_, b1_, eps1_, u2_, w2_, b2_, eps2_, consts,
                a.numpy(), f.numpy(), r2.numpy())  # fmt: skip
        ctx.save_for_backward(x, u1, keep, a, u2, w2, r2)
        ctx.slab_var, ctx.seed, ctx.use = slab_var, seed, use
        return f

    @staticmethod
    def backward(ctx, gf):
        backward = _KERNELS["dropout_backward"]
        x, u1, keep, a, u2, w2, r2 = ctx.saved_tensors
        members, _, d = x.shape
        gw1 = _scratch(ctx, "gw1", (members, d, w2.shape[1]), x)
        gb1, gw2 = _scratch(ctx, "gb1", w2.shape, x), _scratch(ctx, "gw2", w2.shape, x)
        gb2 = _scratch(ctx, "gb2", (members,), x)
        gf_, x_, u1_, keep_, a_, u2_, w2_, r2_ = map(_np, (gf, x, u1, keep, a, u2, w2, r2))
        backward(gf_, x_, ctx.seed, ctx.use, u1_, keep_, a_, u2_, w2_, r2_,
                 _constants(x, ctx.slab_var), *(t.numpy() for t in (gw1, gb1, gw2, gb2)))  # fmt: skip
        return None, None, None, None, gw1, gb1, None, None, gw2, gb2, None, None


def _rates(guide):
    """The drop rates an AutoDropout guide's weight sites use (fixed when its sites were
    set up), ``()`` for other guides."""
    rates = getattr(guide, "_rates", {})
    return tuple(rates[name] for name in (_SITES[0], _SITES[2]) if name in rates)


class _ClosedFormKL:
    r"""Σ over the four sites of KL(q ‖ p) in a few operations per site: the guide's KLs
    (``pyro_dropout.distributions.kl``) against the model's zero-mean Normal priors are

    * mean-field: :math:`\sum c\,(σ^2 + μ^2) - \tfrac12 \sum \log σ^2 + C`,
      :math:`c = 1 / (2 s^2)`;
    * MC dropout (σ and p fixed): :math:`\sum c\,μ^2 + C` with :math:`c = (1 - p) / (2 s^2)`
      for the weights (Gal & Ghahramani's approximation) and :math:`1 / (2 s^2)` for the
      biases,

    with :math:`s` the prior scale. Why not ``kl_divergence`` on the sites' distributions each
    step: building them and the general KL code took 1.0 ms of a 3.7 ms final-phase step (20
    members). The constant :math:`C` is the library's KL minus the variable part, computed
    once from the library's own ``kl_divergence`` at the parameters of the first call."""

    def __init__(self, guide):
        sites = guide.prototype_trace.nodes
        self._made_for = (guide.prototype_trace, _rates(guide))
        self.dropout = isinstance(guide, AutoDropout)
        self.coef, const = [], 0.0
        with torch.no_grad():
            for name in _SITES:
                q, p = guide._site_dist(name, sites[name]), sites[name]["fn"]
                prior = p.base_dist if isinstance(p, Independent) else p
                if not isinstance(prior, Normal) or bool((unexpand(prior.loc) != 0).any()):
                    raise ValueError(f"the fused KL needs zero-mean Normal priors ({name})")
                coef = 0.5 / unexpand(prior.scale) ** 2
                if isinstance(q, BernoulliMaskedNormal):
                    coef = coef * (1 - unexpand(q.dropout_rate))
                self.coef.append(coef)
                loc = guide._get("locs", name)
                if self.dropout:
                    variable = (coef * loc**2).sum()
                else:
                    var = guide._get("scales", name) ** 2
                    variable = (coef * (var + loc**2)).sum() - 0.5 * var.log().sum()
                const += float(kl_divergence(q, p).sum() - variable)
        self.const = const

    def valid_for(self, guide):
        """Made for this guide's sites and drop rates (a new prototype or new rates: no)."""
        trace, rates = self._made_for
        now = _rates(guide)
        same = len(rates) == len(now) and all(a is b for a, b in zip(rates, now, strict=True))
        return trace is guide.prototype_trace and same

    def __call__(self, locs, variances=None):
        if self.dropout:
            terms = [(c * loc * loc).sum() for c, loc in zip(self.coef, locs, strict=True)]
        else:
            terms = [
                (c * (v + loc * loc)).sum() - 0.5 * v.log().sum()
                for c, loc, v in zip(self.coef, locs, variances, strict=True)
            ]
        return sum(terms) + self.const


class _ConcreteMLP(torch.autograd.Function):
    """The D-H-1 network's pre-activation draws under Concrete dropout, given the relaxed keep
    masks ``z1`` ``(M, B, D)`` and ``z2`` ``(M, B, H)`` (drawn from ``logit p``: the gradient to
    ``logit p`` of each layer comes back through ``lp1``/``lp2``, which only the backward
    reads), ``1 / (1 - p)`` of each layer ``(M,)``, the mean weights ``m'`` (first as
    ``(M, D, H)``), the biases' means, the noise, σ² and 1 / t: returns ``f`` ``(M, B)``."""

    @staticmethod
    def forward(ctx, x, z1, z2, lp1, lp2, inv1, inv2, w1, b1, eps1, w2, b2, eps2, slab_var, inv_t):
        _kernels()
        a = _scratch(ctx, "a", eps1.shape, x)
        f, r2 = _scratch(ctx, "f", eps1.shape[:2], x), _scratch(ctx, "r2", eps1.shape[:2], x)
        consts = _constants(x, slab_var, inv_t)
        arrays = [_np(t) for t in (x, z1, z2, inv1, inv2, w1, b1, eps1, w2, b2, eps2)]
        _KERNELS["concrete_forward"](*arrays, consts, a.numpy(), f.numpy(), r2.numpy())
        ctx.save_for_backward(x, z1, z2, inv1, inv2, w1, a, w2, r2)
        ctx.consts = consts
        return f

    @staticmethod
    def backward(ctx, gf):
        x, z1, z2, inv1, inv2, w1, a, w2, r2 = ctx.saved_tensors
        members, _, d = x.shape
        hidden = w2.shape[1]
        gw1 = x.new_empty(members, d, hidden)
        gb1, gw2 = x.new_empty(members, hidden), x.new_empty(members, hidden)
        gb2, glp1, glp2, ginv1, ginv2 = (x.new_empty(members) for _ in range(5))
        outs = (gw1, gb1, gw2, gb2, glp1, glp2, ginv1, ginv2)
        arrays = [_np(t) for t in (gf, x, z1, z2, inv1, inv2, w1, a, w2, r2)]
        _KERNELS["concrete_backward"](*arrays, ctx.consts, *(t.numpy() for t in outs))
        # x, z1, z2, lp1, lp2, inv1, inv2, w1, b1, eps1, w2, b2, eps2, slab_var, inv_t
        return (None, None, None, glp1, glp2, ginv1, ginv2, gw1, gb1, None, gw2, gb2, None,
                None, None)  # fmt: skip


def _concrete_draw(model, guide, x):
    """``f`` under AutoConcreteDropout (relaxed masks, one rate per layer); the random numbers
    drawn as the LRT rules draw them (mask, noise; first layer, then second), the masks by
    the same expression as :func:`~pyro_dropout.distributions.concrete_keep_mask`."""
    if not guide.relaxed:
        raise ValueError("the fused Concrete loss draws relaxed masks: train with gradients on")
    members, batch = x.shape[0], x.shape[1]
    hidden = model.layers[0].out_features
    locs = [guide._get("locs", name) for name in _SITES]
    rates = [guide._rate(name).reshape(members) for name in (_SITES[0], _SITES[2])]
    lp = [torch.logit(p) for p in rates]
    inv = [torch.reciprocal(1 - p) for p in rates]
    scale, eps = -1.0 / guide.temperature, torch.finfo(x.dtype).eps

    def keep(logit_p, shape):
        noise = torch.logit(torch.rand(shape, dtype=x.dtype), eps=eps)
        lp_ = logit_p.detach().reshape((members,) + (1,) * (len(shape) - 1))
        return torch.sigmoid(torch.add(lp_ * scale, noise, alpha=scale))

    z1 = keep(lp[0], (members, batch, x.shape[2]))
    eps1 = torch.randn(members, batch, hidden, dtype=x.dtype)
    z2 = keep(lp[1], (members, batch, hidden))
    eps2 = torch.randn(members, batch, dtype=x.dtype)
    return _ConcreteMLP.apply(
        x,
        z1,
        z2,
        lp[0],
        lp[1],
        inv[0],
        inv[1],
        locs[0].reshape(members, hidden, -1).transpose(1, 2),
        locs[1].reshape(members, hidden),
        eps1,
        locs[2].reshape(members, hidden),
        locs[3].reshape(members),
        eps2,
        guide.scale**2,
        1.0 / guide.temperature,
    )


def fused_loss(model, guide, x, y, num_data=None, masks="kernel"):
    """The negative ELBO of ``(model, guide)`` on the minibatch ``x`` ``(M, B, D)``, ``y``
    ``(M, B)``, as a differentiable scalar of the guide's (and the model's) parameters.
    Raises ``ValueError`` when :func:`unsupported_reason` names a reason.

    :param masks: where AutoDropout's mask uniforms come from: ``"kernel"`` (the default,
        counter-based draws inside the kernels, 10x cheaper than torch's CPU generator) or
        ``"torch"`` (``torch.rand``, as the LRT rules draw them: the tests' exact check).
        Concrete dropout's relaxed masks always come from torch (see :class:`_ConcreteMLP`)."""
    if masks not in ("kernel", "torch"):
        raise ValueError(f"masks must be 'kernel' or 'torch', got {masks!r}")
    reason = unsupported_reason(model, guide)
    if reason is not None:
        raise ValueError(f"fused_loss cannot train this model: {reason}")
    if x.device.type != "cpu":
        raise ValueError("fused_loss runs on CPU tensors (numba kernels)")
    if guide.prototype_trace is None:
        guide._setup_prototype(x, y, num_data=num_data)
    if isinstance(guide, (AutoVariationalDropout, AutoConcreteDropout)):
        # Its KL (Molchanov's approximation in log α) does not fit the closed forms of
        # _ClosedFormKL: the sites' distributions and the library's KL, as the ELBO does;
        # the sites are Gaussian, so mean-field's kernels draw f.
        sites = guide.prototype_trace.nodes
        q = [guide._site_dist(name, sites[name]) for name in _SITES]
        kl = sum(kl_divergence(d, sites[n]["fn"]).sum() for d, n in zip(q, _SITES, strict=True))
        if isinstance(guide, AutoConcreteDropout):
            f = _concrete_draw(model, guide, x)  # torch's masks (see _ConcreteMLP)
        else:
            locs = [d.base_dist.loc for d in q]
            var = [d.base_dist.variance.expand_as(loc) for d, loc in zip(q, locs, strict=True)]
            f = _meanfield_draw(model, x, locs, var)
        return kl - _scaled_log_likelihood(model, f, y, num_data)
    plan = getattr(guide, "_fused_kl", None)
    if plan is None or not plan.valid_for(guide):
        plan = guide._fused_kl = _ClosedFormKL(guide)
    locs = [guide._get("locs", name) for name in _SITES]
    if isinstance(guide, AutoDropout):
        kl = plan(locs)
        f = _dropout_draw(model, guide, x, masks, locs)
    else:
        var = [guide._get("scales", name) ** 2 for name in _SITES]
        kl = plan(locs, var)
        f = _meanfield_draw(model, x, locs, var)
    return kl - _scaled_log_likelihood(model, f, y, num_data)


def _scaled_log_likelihood(model, f, y, num_data):
    """``(N / B) Σ log N(y | f, s_m²)``: the minibatch's log-likelihood on the full-data
    scale, as the model's ``data`` plate scales it."""
    members, batch = f.shape
    sd = model.noise_sd().reshape(members, 1)
    n = batch if num_data is None else int(num_data)
    z = (y - f) / sd
    log_lik = -0.5 * (z * z).sum() - batch * torch.log(sd).sum()
    log_lik = log_lik - 0.5 * math.log(2 * math.pi) * members * batch
    return (n / batch) * log_lik


def _dropout_draw(model, guide, x, masks, locs):
    """``f`` under AutoDropout. With ``masks="torch"`` the masks' uniforms come from
    ``torch.rand``, drawn in the order the LRT rules draw them (mask, noise; first layer,
    then second); with ``"kernel"`` the kernels draw them from a seed that torch draws."""
    return _DropoutMLP.apply(*_dropout_args(model, guide, x, masks, locs))


def _dropout_args(model, guide, x, masks, locs, ctx=None):
    """The inputs of :class:`_DropoutMLP`, random draws included (the noise into ``ctx``'s
    kept tensors when given: see :func:`_scratch`)."""
    members, batch = x.shape[0], x.shape[1]
    hidden = model.layers[0].out_features
    rate = torch.as_tensor(_rates(guide)[0], dtype=x.dtype)
    keep = (1 - rate).reshape(-1).expand(members)
    seed, u1, u2 = 0, None, None
    if masks == "kernel":
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    else:
        u1 = torch.rand(members, batch, x.shape[2], dtype=x.dtype)
    eps1 = _scratch(ctx, "eps1", (members, batch, hidden), x).normal_()
    if masks != "kernel":
        u2 = torch.rand(members, batch, hidden, dtype=x.dtype)
    eps2 = _scratch(ctx, "eps2", (members, batch), x).normal_()
    w1 = locs[0].reshape(members, hidden, -1).transpose(1, 2)
    w2, b1, b2 = locs[2].reshape(members, hidden), locs[1].reshape(members, hidden), locs[3]
    return x, seed, u1, keep, w1, b1, eps1, u2, w2, b2.reshape(members), eps2, guide.scale**2


def _meanfield_draw(model, x, loc, var):
    """``f`` under AutoMeanField, from the sites' means and variances (in ``_SITES`` order)."""
    members, batch = x.shape[0], x.shape[1]
    hidden = model.layers[0].out_features
    eps1 = torch.randn(members, batch, hidden, dtype=x.dtype)
    eps2 = torch.randn(members, batch, dtype=x.dtype)
    f = _GaussianMLP.apply(
        x,
        loc[0].reshape(members, hidden, -1).transpose(1, 2),
        var[0].reshape(members, hidden, -1).transpose(1, 2),
        loc[1].reshape(members, hidden),
        var[1].reshape(members, hidden),
        loc[2].reshape(members, hidden),
        var[2].reshape(members, hidden),
        loc[3].reshape(members),
        var[3].reshape(members),
        eps1,
        eps2,
    )
    return f


class _Ctx:
    """Stands in for autograd's context when the step calls a Function's forward and backward
    itself (no graph is recorded); ``buffers`` keeps the step's large tensors across steps."""

    def __init__(self, buffers=None):
        self.buffers = buffers

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


class _Unconstrained:
    """One parameter as Pyro's store holds it: the unconstrained tensor (what Adam steps) and
    its transform to the constrained value, with the derivative of that transform."""

    def __init__(self, module, dotted):
        path, _, leaf = dotted.rpartition(".")
        owner = _deep_getattr(module, path) if path else module
        self.tensor = getattr(owner, leaf + "_unconstrained")
        self.transform = transform_to(owner._pyro_params[leaf][0])
        self.identity = self.transform == transform_to(torch.distributions.constraints.real)

    def value(self):
        return self.tensor if self.identity else self.transform(self.tensor)

    def chain(self, grad, value):
        """d loss / d unconstrained, given d loss / d value (an element-wise transform)."""
        if self.identity:
            return grad
        return grad * self.transform.log_abs_det_jacobian(self.tensor, value).exp()


class _ManualGradients:
    """The loss of :func:`fused_loss` and its gradients written out by hand: the kernels'
    backward for the network, the KL's derivatives in closed form (mean-field and MC dropout:
    :math:`∂/∂μ = 2cμ`, and for mean-field :math:`∂/∂σ^2 = c - 1/(2σ^2)`; VD and Concrete
    dropout in :meth:`_vd` and :meth:`_init_concrete`), the likelihood's for ``f`` and the
    learned noise SDs, chained through each parameter's transform.

    Why: without a graph, a 20-member final step skips autograd's and the transforms'
    per-operation overhead (the step is bound by it, not by arithmetic). Checked against
    autograd of :func:`fused_loss` given the same noise (``tests/benchmarks/test_uci_fused.py``).
    """

    def __init__(self, model, guide):
        self.model, self.guide = model, guide
        self.buffers = {}  # the step's large tensors, kept across steps (see _scratch)
        self.dropout = isinstance(guide, AutoDropout)
        self.vd = isinstance(guide, AutoVariationalDropout)
        self.concrete = isinstance(guide, AutoConcreteDropout)
        self.locs = [_Unconstrained(guide.locs, name) for name in _SITES]
        if self.concrete:
            self._init_concrete(guide)
        self.noise = None if model.learned_sd is None else _Unconstrained(model, "learned_sd")
        if self.vd:  # weights: θ and log σ²; biases: Normal(μ, softplus(ρ)) under Normal priors
            self.log_var = {i: _Unconstrained(guide.log_sigma2, _SITES[i]) for i in (0, 2)}
            self.scales = {i: _Unconstrained(guide.scales, _SITES[i]) for i in (1, 3)}
            sites = guide.prototype_trace.nodes
            self.bias_prior = {}
            for i in (1, 3):
                prior = sites[_SITES[i]]["fn"]
                prior = prior.base_dist if isinstance(prior, Independent) else prior
                if not isinstance(prior, Normal) or bool((unexpand(prior.loc) != 0).any()):
                    raise ValueError("the hand-written VD gradients need zero-mean Normal priors")
                self.bias_prior[i] = unexpand(prior.scale).detach()
        else:
            fixed = self.dropout or self.concrete  # fixed slab scales: no parameter
            self.scales = None if fixed else [_Unconstrained(guide.scales, n) for n in _SITES]

    def _init_concrete(self, guide):
        r"""Concrete dropout's KL per weight site (Gal, Hron & Kendall's, zero-mean prior of
        scale s, K input units): :math:`\frac{\sum m'^2}{2 s^2 (1 - p)} + K (p \log p + (1-p)
        \log(1-p)) + C`; per bias (Normal(μ, σ) with σ fixed): :math:`\sum μ^2 / (2 s^2) + C`.
        The coefficients from the model's priors, the constants C from the library's KL."""
        sites = guide.prototype_trace.nodes
        self.rates = {i: _Unconstrained(guide.drop_rates, _SITES[i]) for i in (0, 2)}
        self.half_precision, self.units, const = {}, {}, 0.0
        with torch.no_grad():
            for i, name in enumerate(_SITES):
                prior = sites[name]["fn"]
                prior = prior.base_dist if isinstance(prior, Independent) else prior
                if not isinstance(prior, Normal) or bool((unexpand(prior.loc) != 0).any()):
                    raise ValueError("the hand-written Concrete gradients need zero-mean priors")
                hp = 0.5 / unexpand(prior.scale) ** 2
                self.half_precision[i] = hp
                loc = guide._get("locs", name)
                if i in self.rates:
                    self.units[i] = loc.shape[-1]
                    p = guide._rate(name)
                    variable = ((hp * loc**2).sum((-1, -2), keepdim=True) / (1 - p)).sum()
                    entropy = p * torch.log(p) + (1 - p) * torch.log1p(-p)
                    variable = variable + (self.units[i] * entropy).sum()
                else:
                    variable = (hp * loc**2).sum()
                q = guide._site_dist(name, sites[name])
                const += float(kl_divergence(q, sites[name]["fn"]).sum() - variable)
        self.concrete_const = const

    def _concrete(self, x, y, n, locs, members, batch, hidden):
        """Concrete dropout: the kernels' backward gives d/d logit p and d/d (1/(1-p)) of each
        layer, chained to p (clamped to [eps, 1 - eps] as the guide does) and to its
        unconstrained parameter with the KL's own d/dp."""
        guide = self.guide
        eps = torch.finfo(x.dtype).eps
        raw = {i: h.value() for i, h in self.rates.items()}
        rate = {i: r.clamp(eps, 1 - eps) for i, r in raw.items()}
        kl, d_loc, d_rate = self.concrete_const, {}, {}
        for i, loc in enumerate(locs):
            hp = self.half_precision[i]
            if i in rate:
                p = rate[i]
                sq = (hp * loc * loc).sum((-1, -2), keepdim=True)
                entropy = p * torch.log(p) + (1 - p) * torch.log1p(-p)
                kl = kl + (sq / (1 - p)).sum() + (self.units[i] * entropy).sum()
                d_loc[i] = 2 * hp * loc / (1 - p)
                d_rate[i] = sq / (1 - p) ** 2 + self.units[i] * (torch.log(p) - torch.log1p(-p))
            else:
                kl = kl + (hp * loc * loc).sum()
                d_loc[i] = 2 * hp * loc
        lp = {i: torch.logit(p) for i, p in rate.items()}
        inv = {i: torch.reciprocal(1 - p) for i, p in rate.items()}
        scale, feps = -1.0 / guide.temperature, torch.finfo(x.dtype).eps

        def keep(logit_p, shape):
            noise = torch.logit(torch.rand(shape, dtype=x.dtype), eps=feps)
            lp_ = logit_p.reshape((members,) + (1,) * (len(shape) - 1))
            return torch.sigmoid(torch.add(lp_ * scale, noise, alpha=scale))

        z1 = keep(lp[0], (members, batch, x.shape[2]))
        ctx = _Ctx(self.buffers)
        eps1 = _scratch(ctx, "eps1", (members, batch, hidden), x).normal_()
        z2 = keep(lp[2], (members, batch, hidden))
        eps2 = _scratch(ctx, "eps2", (members, batch), x).normal_()
        f = _ConcreteMLP.forward(
            ctx, x, z1, z2, lp[0].reshape(members), lp[2].reshape(members),
            inv[0].reshape(members), inv[2].reshape(members),
            locs[0].reshape(members, hidden, -1).transpose(1, 2), locs[1].reshape(members, hidden),
            eps1, locs[2].reshape(members, hidden), locs[3].reshape(members), eps2,
            guide.scale**2, 1.0 / guide.temperature,
        )  # fmt: skip
        sd = self.model.noise_sd().reshape(members, 1)
        z = (y - f) / sd
        log_lik = -0.5 * (z * z).sum() - batch * torch.log(sd).sum()
        log_lik = log_lik - 0.5 * math.log(2 * math.pi) * members * batch
        loss = kl - (n / batch) * log_lik
        out = _ConcreteMLP.backward(ctx, (n / batch) * (-z / sd))
        glp = {0: out[3], 2: out[4]}
        ginv = {0: out[5], 2: out[6]}
        g_net = [out[7].transpose(1, 2), out[8], out[10], out[11]]
        grads = {}
        for i, h in enumerate(self.locs):
            grads[h.tensor] = (d_loc[i] + g_net[i].reshape(locs[i].shape)).contiguous()
        for i, h in self.rates.items():
            p = rate[i]
            g_p = d_rate[i] + (
                glp[i].reshape(p.shape) / (p * (1 - p)) + ginv[i].reshape(p.shape) / (1 - p) ** 2
            )
            g_p = torch.where((raw[i] >= eps) & (raw[i] <= 1 - eps), g_p, torch.zeros_like(g_p))
            grads[h.tensor] = h.chain(g_p, raw[i]).contiguous()
        if self.noise is not None:
            g_sd = (n / batch) * ((1 - z * z) / sd).sum(-1, keepdim=True)
            g_sd = torch.where(self.model.learned, g_sd, torch.zeros_like(g_sd))
            grads[self.noise.tensor] = self.noise.chain(g_sd, self.noise.value())
        return loss.item(), grads

    @staticmethod
    def applies(model, guide):
        if type(guide) is AutoConcreteDropout:
            return guide.rate_per == "layer"
        if type(guide) is AutoVariationalDropout:
            # written for one log σ² per weight and Molchanov's KL
            return guide.alpha == "weight" and _kl._approximation == "molchanov"
        return type(guide) in (AutoMeanField, AutoDropout)

    def __call__(self, x, y, num_data, masks):
        """``(loss, {unconstrained tensor: gradient})``."""
        guide, model = self.guide, self.model
        members, batch = x.shape[0], x.shape[1]
        hidden = model.layers[0].out_features
        n = batch if num_data is None else int(num_data)
        grads = {}
        with torch.no_grad():
            locs = [h.tensor for h in self.locs]
            if self.vd:
                return self._vd(x, y, n, locs, members, batch, hidden)
            if self.concrete:
                return self._concrete(x, y, n, locs, members, batch, hidden)
            plan = getattr(guide, "_fused_kl", None)
            if plan is None or not plan.valid_for(guide):
                plan = guide._fused_kl = _ClosedFormKL(guide)
            if self.dropout:
                kl = plan(locs)
                f, backward = self._dropout(x, locs, masks, members, batch, hidden)
            else:
                sigma = [h.value() for h in self.scales]
                var = [s * s for s in sigma]
                kl = plan(locs, var)
                f, backward = self._gaussian(x, locs, var, members, batch, hidden)
            sd = model.noise_sd().reshape(members, 1)
            z = (y - f) / sd
            log_lik = -0.5 * (z * z).sum() - batch * torch.log(sd).sum()
            log_lik = log_lik - 0.5 * math.log(2 * math.pi) * members * batch
            loss = kl - (n / batch) * log_lik
            # d loss / d f = (N / B) (f - y) / s², and per member d loss / d s = (N / B) Σ (1 - z²) / s
            g_loc, g_var = backward((n / batch) * (-z / sd))
            # Gradients in the parameters' own (contiguous) layout: the kernels' first-layer
            # gradients are transposed views, and torch's fused optimisers assume that a
            # gradient is laid out as its parameter (autograd guarantees it; we set .grad).
            for h, c, loc, g in zip(self.locs, plan.coef, locs, g_loc, strict=True):
                grads[h.tensor] = (2 * c * loc + g.reshape(loc.shape)).contiguous()
            if not self.dropout:
                for h, c, s, v, g in zip(self.scales, plan.coef, sigma, var, g_var, strict=True):
                    g_v = (c - 0.5 / v) + g.reshape(v.shape)
                    grads[h.tensor] = h.chain(g_v * 2 * s, s).contiguous()
            if self.noise is not None:
                g_sd = (n / batch) * ((1 - z * z) / sd).sum(-1, keepdim=True)
                g_sd = torch.where(model.learned, g_sd, torch.zeros_like(g_sd))
                grads[self.noise.tensor] = self.noise.chain(g_sd, self.noise.value())
        return loss.item(), grads

    def _vd(self, x, y, n, locs, members, batch, hidden):
        r"""Variational dropout: weights :math:`\mathcal N(θ, \exp(\log σ^2))` with
        Molchanov's KL in :math:`\log α = \operatorname{clip}(\log σ^2 - \log(θ^2 + ε))`
        (``pyro_dropout.distributions.kl``), biases Normal with Normal priors."""
        grads, kl, var, sigma = {}, 0.0, [None] * 4, {}
        lo, hi = _kl.LOG_ALPHA_RANGE
        tiny = torch.finfo(x.dtype).tiny
        d_log_var, d_loc = {}, {}
        for i, h in self.log_var.items():
            log_var, loc = h.tensor, locs[i]
            var[i] = log_var.exp()
            raw = log_var - torch.log(loc * loc + tiny)
            log_alpha = raw.clamp(lo, hi)
            sig = torch.sigmoid(_kl.K2 + _kl.K3 * log_alpha)
            kl = kl - (_kl.K1 * sig - 0.5 * F.softplus(-log_alpha) - _kl.K1).sum()
            # d KL / d log α, zero where the clip holds (hardtanh's gradient)
            g = -(_kl.K1 * _kl.K3 * sig * (1 - sig) + 0.5 * torch.sigmoid(-log_alpha))
            g = torch.where((raw > lo) & (raw < hi), g, torch.zeros_like(g))
            d_log_var[i] = g
            d_loc[i] = g * (-2 * loc / (loc * loc + tiny))
        for i, h in self.scales.items():
            s, loc, s0 = h.value(), locs[i], self.bias_prior[i]
            sigma[i], var[i] = s, s * s
            c = 0.5 / (s0 * s0)
            kl = kl + ((var[i] + loc * loc) * c - torch.log(s)).sum()
            kl = kl + ((torch.log(s0) - 0.5) * torch.ones_like(loc)).sum()
            d_loc[i] = 2 * c * loc
            d_log_var[i] = c - 0.5 / var[i]  # here: d KL / d σ²
        f, backward = self._gaussian(x, locs, var, members, batch, hidden)
        sd = self.model.noise_sd().reshape(members, 1)
        z = (y - f) / sd
        log_lik = -0.5 * (z * z).sum() - batch * torch.log(sd).sum()
        log_lik = log_lik - 0.5 * math.log(2 * math.pi) * members * batch
        loss = kl - (n / batch) * log_lik
        g_loc, g_var = backward((n / batch) * (-z / sd))
        for i, h in enumerate(self.locs):
            grads[h.tensor] = (d_loc[i] + g_loc[i].reshape(locs[i].shape)).contiguous()
        for i, h in self.log_var.items():  # d / d log σ² = σ² d / d σ²
            g = d_log_var[i] + g_var[i].reshape(var[i].shape) * var[i]
            grads[h.tensor] = g.contiguous()
        for i, h in self.scales.items():
            g_v = d_log_var[i] + g_var[i].reshape(var[i].shape)
            grads[h.tensor] = h.chain(g_v * 2 * sigma[i], sigma[i]).contiguous()
        if self.noise is not None:
            g_sd = (n / batch) * ((1 - z * z) / sd).sum(-1, keepdim=True)
            g_sd = torch.where(self.model.learned, g_sd, torch.zeros_like(g_sd))
            grads[self.noise.tensor] = self.noise.chain(g_sd, self.noise.value())
        return loss.item(), grads

    def _gaussian(self, x, locs, var, members, batch, hidden):
        ctx = _Ctx(self.buffers)
        w1m = locs[0].reshape(members, hidden, -1).transpose(1, 2)
        w1v = var[0].reshape(members, hidden, -1).transpose(1, 2)
        eps1 = _scratch(ctx, "eps1", (members, batch, hidden), x).normal_()
        eps2 = _scratch(ctx, "eps2", (members, batch), x).normal_()
        f = _GaussianMLP.forward(
            ctx,
            x,
            w1m,
            w1v,
            locs[1].reshape(members, hidden),
            var[1].reshape(members, hidden),
            locs[2].reshape(members, hidden),
            var[2].reshape(members, hidden),
            locs[3].reshape(members),
            var[3].reshape(members),
            eps1,
            eps2,
        )

        def backward(gf):
            _, gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v, _, _ = _GaussianMLP.backward(ctx, gf)
            g_loc = [gw1m.transpose(1, 2), gb1m, gm2, gb2m]
            g_var = [gw1v.transpose(1, 2), gb1v, gv2, gb2v]
            return g_loc, g_var

        return f, backward

    def _dropout(self, x, locs, masks, members, batch, hidden):
        ctx = _Ctx(self.buffers)
        f = _DropoutMLP.forward(ctx, *_dropout_args(self.model, self.guide, x, masks, locs, ctx))

        def backward(gf):
            out = _DropoutMLP.backward(ctx, gf)
            gw1, gb1, gw2, gb2 = out[4], out[5], out[8], out[9]
            return [gw1.transpose(1, 2), gb1, gw2, gb2], None

        return f, backward


class FusedSVI:
    """``SVI.step`` with :func:`fused_loss`: the loss, its gradients and one step of
    ``optim`` (a :class:`pyro.optim.PyroOptim`) over every parameter in Pyro's store.
    The gradients come from :class:`_ManualGradients` (no autograd graph) where it applies
    (every guide of the benchmark; VD with one log σ² per weight and Molchanov's KL, Concrete
    dropout with one rate per layer), else from autograd of :func:`fused_loss`.

    Why not ``pyro.infer.SVI(model, guide, optim, loss=fused_loss)``: SVI finds the
    parameters to step by tracing ``pyro.param`` calls, and a ``PyroModule`` makes them only
    inside its own ``__call__``; this loss reads the parameters without running the modules.
    All parameters take part in every step here, so the first step runs the guide once (which
    registers the guide's and the model's parameters) and every step updates them all."""

    def __init__(self, model, guide, optim, masks="kernel", manual=True):
        reason = unsupported_reason(model, guide)
        if reason is not None:
            raise ValueError(f"FusedSVI cannot train this model: {reason}")
        self.model, self.guide, self.optim, self.masks = model, guide, optim, masks
        self.manual = manual and _ManualGradients.applies(model, guide)
        self._params = None
        self._grads = None

    def step(self, x, y, num_data=None):
        if self._params is None:
            self.guide(x, y, num_data=num_data)
            self._params = [p for _, p in pyro.get_param_store().named_parameters()]
            if self.manual:
                try:
                    self._grads = _ManualGradients(self.model, self.guide)
                except ValueError:  # a prior the hand-written gradients do not cover
                    self.manual = False
        if self.manual:
            loss, grads = self._grads(x, y, num_data, self.masks)
            for p in self._params:
                p.grad = grads.get(p)
        else:
            loss = fused_loss(self.model, self.guide, x, y, num_data, self.masks)
            loss.backward()
            loss = loss.item()
        self.optim(self._params)
        for p in self._params:
            p.grad = None
        return loss


class FusedDraw:
    """Monte-Carlo passes of :func:`~pyro_dropout.benchmarks.uci_model.evaluate` with one
    weight draw per pass (``draws="weights"``): the guide's weights drawn as the traced draw
    draws them (the guide traced under a plate of ``c`` samples), the network's forward on
    every row in one numba kernel. Why: on kin8nm's 240 validation members the traced pass
    (blocks of 74 rows, a (240, 74, 8) x (240, 8, 50) product, a bias, a ReLU per block) took
    68 ms, bound by those small products and element-wise passes.

    Same call as the traced draw, ``draw(x, c, rows)`` → ``f`` ``(c, M, N)``; ``rows`` is
    ignored (the kernel streams the rows)."""

    def __init__(self, model, guide):
        reason = _predict_unsupported(model)
        if reason is not None:
            raise ValueError(f"FusedDraw cannot draw for this model: {reason}")
        self.model, self.guide = model, guide
        self.compile_s, self.compile_samples = 0.0, 0

    def __call__(self, x, c, rows=None):
        _kernels()
        with pyro.plate("_mc_samples", c, dim=-3):
            trace = pyro.poutine.trace(self.guide).get_trace(x[:, :1])
        w = [trace.nodes[name]["value"] for name in _SITES]
        members, d = x.shape[0], x.shape[2]
        hidden = self.model.layers[0].out_features
        w1 = w[0].reshape(c, members, hidden, d).transpose(2, 3)
        b1 = w[1].reshape(c, members, hidden)
        w2, b2 = w[2].reshape(c, members, hidden), w[3].reshape(c, members)
        f = x.new_empty(c, members, x.shape[1])
        _KERNELS["predict"](*map(_np, (x, w1, b1, w2, b2)), _constants(x), f.numpy())
        return f


def _predict_unsupported(model):
    if numba is None:
        return "numba is not installed (pip install 'pyro-dropout[benchmarks]')"
    if getattr(model, "heteroscedastic", True):
        return "the fused draw has one output (no heteroscedastic head)"
    if len(model.layers) != 2 or model.layers[1].out_features != 1:
        return "the fused draw is written for D-H-1 networks"
    return None


def predict_supports(model):
    """Whether :class:`FusedDraw` can draw for ``model`` (any guide)."""
    return _predict_unsupported(model) is None

r"""The numba kernels of the fused UCI step: the D-H-1 network's pre-activation draws and their
gradients in one pass over the rows each, for the Gaussian guides (mean-field, VD), MC dropout
(mask uniforms drawn inside) and Concrete dropout (relaxed masks given), and the Monte-Carlo
forward pass of weight draws (``predict``), and standard normal draws (``fill_normal``).

Why our own: the batched validation step (240 members x 128 rows through 8-50-1) is bound by
element-wise passes over ``(M, B, H)`` tensors, not by its matrix products, and this torch
build has no CPU fuser (see the package's docstring).

Arrays come in as numpy views of torch tensors (:func:`as_array`); outputs are written in
place. Constants come typed like the data (:func:`constants`), so float32 data runs float32
arithmetic throughout.
"""

from __future__ import annotations

from pyro_dropout.handlers.lrt_rules import VARIANCE_FLOOR

try:  # optional: the benchmark's extra (``pip install pyro-dropout[benchmarks]``)
    import numba
    import numpy as np
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = np = None

_COMPILED = {}


def available():
    """Whether numba is installed (the kernels need it)."""
    return numba is not None


def compiled():
    """The kernels by name, compiled at first use (and cached on disk by numba)."""
    if not _COMPILED:
        _COMPILED.update(_compile())
    return _COMPILED


def as_array(t):
    """A numpy view of ``t`` (contiguous, detached) for the kernels."""
    return t.detach().contiguous().numpy()


def constants(like, slab_var=0.0, inv_temperature=0.0):
    """The kernels' constants (variance floor, 1/2, 0, 2, the slab variance σ², the clamp of
    the uniforms in ``logit u`` (the dtype's eps, as ``torch.logit(u, eps)``), 1 / t) in
    ``like``'s dtype: float32 data then runs float32 arithmetic throughout."""
    dtype = as_array(like).dtype
    eps = np.finfo(dtype).eps
    return np.array([VARIANCE_FLOOR, 0.5, 0.0, 2.0, slab_var, eps, inv_temperature], dtype=dtype)


def _compile():
    jit = numba.njit(fastmath=True, cache=True, error_model="numpy", nogil=True)

    # Branch-free inner loops over the hidden units (selects, not jumps), so that LLVM
    # vectorises them; constants typed like the data (float32 stays float32). The
    # first layer's products run here too, over the hidden units (K = D is too small
    # for a matrix product to be efficient: 3 ms per (240, 128, 8) x (240, 8, 50) bmm).
    @jit
    def gaussian_forward(x, w1m, w1v, b1m, b1v, eps1, m2, v2, b2m, b2v, eps2, consts, a, r, f, r2):
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
    def gaussian_backward(
        gf, x, a, r, r2, m2, v2, consts, gw1m, gw1v, gb1m, gb1v, gm2, gv2, gb2m, gb2v
    ):
        zero, two = consts[2], consts[3]
        nm, nb, nh = a.shape
        nd = x.shape[2]
        g = np.empty(nh, dtype=a.dtype)
        gr = np.empty(nh, dtype=a.dtype)
        for m in range(nm):
            gw1m[m] = zero
            gw1v[m] = zero
            gb1m[m] = zero
            gb1v[m] = zero
            gm2[m] = zero
            gv2[m] = zero
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

    s8, m24 = np.uint64(8), np.uint64(0xFFFFFF)
    f32 = np.float32
    chunk = 1024

    @jit
    def fill_normal(out, seed):
        # Standard normal draws into the 1-D array ``out`` by Box-Muller (1958): pair k of
        # uniforms from one SplitMix64 output (the stream of ``seed`` at counter k; 24 bits
        # each, u1 in (0, 1], u2 in [0, 1)), r = sqrt(-2 log u1), θ = 2π u2; out[k] = r cos θ,
        # out[pairs + k] = r sin θ. Why not torch's ``normal_``: its Mersenne Twister took
        # 4.2 ms of a 14 ms step for (240, 128, 50). The log, cos and sin are polynomials
        # (exact to about 1e-7 in float32; LLVM has no vector libm here), so that the loops
        # vectorise: log as e ln 2 + 2 atanh((m - 1)/(m + 1)) from u1's exponent and mantissa
        # (the float's bits, through array views), cos and sin by their series on
        # [-π/4, π/4] after removing the quadrant of θ. |out| ≤ sqrt(48 ln 2) = 5.77, as for
        # torch's float32 draws (24-bit uniforms).
        n = out.size
        pairs = (n + 1) // 2
        u1 = np.empty(chunk, dtype=np.float32)
        u2 = np.empty(chunk, dtype=np.float32)
        bits = u1.view(np.uint32)
        mant = np.empty(chunk, dtype=np.uint32)
        mant_f = mant.view(np.float32)
        expo = np.empty(chunk, dtype=np.float32)
        rad = np.empty(chunk, dtype=np.float32)
        sines = np.empty(chunk, dtype=np.float32)
        scale = f32(5.9604644775390625e-08)  # 2^-24
        # Short loops over chunks of pairs (in L1), each simple enough for LLVM to vectorise:
        # one store stream per loop (two into ``out`` in one loop kept it scalar: 6.3 ms).
        for start in range(0, pairs, chunk):
            cnt = min(chunk, pairs - start)
            for i in range(cnt):
                z = seed + np.uint64(start + i) * golden
                z = (z ^ (z >> s30)) * mix1
                z = (z ^ (z >> s27)) * mix2
                z = z ^ (z >> s31)
                u1[i] = f32((z >> s40) + np.uint64(1)) * scale
                u2[i] = f32((z >> s8) & m24) * scale
            for i in range(cnt):
                b = bits[i]
                expo[i] = f32(np.int32(b >> np.uint32(23)) - np.int32(127))
                mant[i] = (b & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)
            for i in range(cnt):
                m = mant_f[i]
                e = expo[i]
                big = m > f32(1.4142135)
                m = m * f32(0.5) if big else m
                e = e + f32(1.0) if big else e
                s = (m - f32(1.0)) / (m + f32(1.0))
                s2 = s * s
                p = f32(1 / 9) + s2 * f32(1 / 11)
                p = f32(1 / 7) + s2 * p
                p = f32(1 / 5) + s2 * p
                p = f32(1 / 3) + s2 * p
                p = f32(1.0) + s2 * p
                rad[i] = np.sqrt(f32(-2.0) * (e * f32(0.6931471805599453) + f32(2.0) * s * p))
            for i in range(cnt):
                t = u2[i] - f32(0.5)  # θ = 2π t, t in [-1/2, 1/2)
                q = np.floor(f32(4.0) * t + f32(0.5))  # the quadrant, -2 … 2
                f = (t - q * f32(0.25)) * f32(6.283185307179586)  # in [-π/4, π/4]
                f2 = f * f
                sn = f32(-1 / 362880) * f2 + f32(1 / 5040)
                sn = sn * f2 - f32(1 / 120)
                sn = sn * f2 + f32(1 / 6)
                sn = f - f * f2 * sn
                cs = f32(1 / 40320) - f2 * f32(1 / 3628800)
                cs = cs * f2 - f32(1 / 720)
                cs = cs * f2 + f32(1 / 24)
                cs = cs * f2 - f32(0.5)
                cs = f32(1.0) + f2 * cs
                # rotate by q quarter turns (k = q mod 4), branch-free: k odd swaps cos and
                # sin; cos is negated for k in {1, 2}, sin for k in {2, 3}
                k = q - f32(4.0) * np.floor(q * f32(0.25))
                half = np.floor(k * f32(0.5))
                odd = k - f32(2.0) * half
                k1 = k + f32(1.0)
                k1 = k1 - f32(4.0) * np.floor(k1 * f32(0.25))
                sign_c = f32(1.0) - f32(2.0) * np.floor(k1 * f32(0.5))
                sign_s = f32(1.0) - f32(2.0) * half
                out[start + i] = rad[i] * sign_c * (cs + odd * (sn - cs))
                sines[i] = rad[i] * sign_s * (sn + odd * (cs - sn))
            for i in range(min(cnt, n - pairs - start)):  # n odd: the last sine is dropped
                out[pairs + start + i] = sines[i]

    # MC dropout (AutoDropout, Gal & Ghahramani's W = M diag(z) + σε): per row, a keep
    # mask on each layer's inputs (z = u < 1 - p from the uniforms u), the masked
    # inputs' product with M, and the slab noise σ² Σ x² (+ σ² for the bias) shared by
    # the row's units. σ and p are fixed, so only M and the biases get gradients. Mask
    # counters: row (m, i) owns D + H of them, the first layer's inputs then the second's.
    @jit
    def dropout_forward(x, seed, use, u1, keep, w1, b1, eps1, u2, w2, b2, eps2, consts, a, f, r2):
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
            gw1[m] = zero
            gb1[m] = zero
            gw2[m] = zero
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
            gw1[m] = zero
            gb1[m] = zero
            gw2[m] = zero
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

    return {
        "gaussian_forward": gaussian_forward,
        "gaussian_backward": gaussian_backward,
        "dropout_forward": dropout_forward,
        "dropout_backward": dropout_backward,
        "concrete_forward": concrete_forward,
        "concrete_backward": concrete_backward,
        "predict": predict,
        "fill_normal": fill_normal,
    }

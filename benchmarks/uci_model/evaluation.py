"""Test metrics of the members: RMSE and log-likelihood, streamed over Monte-Carlo chunks."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import pyro
import torch
from pyro import poutine

from pyro_dropout import local_reparameterization

from .. import uci_fused
from .draw import _Draw
from .members import _expand_members

#: Elements (c·M·N·width) per vectorised Monte-Carlo chunk: cache-sized passes are fastest on a
#: CPU (240 members x 91 rows: 2**20 took 0.69x the time of 2**23).
_CHUNK_BUDGET = 2**20
#: What one Monte-Carlo pass of :func:`evaluate` draws: one weight sample for all rows, or
#: fresh pre-activations per row (local reparameterisation).
MC_DRAWS = ("weights", "examples")


@dataclass
class Evaluation:
    """Per-member test metrics on the original target scale (``(M,)`` float64 tensors)."""

    rmse: torch.Tensor
    ll: torch.Tensor
    rmse_mean_weights: torch.Tensor
    tau: torch.Tensor
    wall_s: float
    samples: torch.Tensor | None = None  # (T, M, N) original scale, if requested
    #: ``(K, M)`` LL with each member's τ multiplied by ``tau_factors[k]``, if requested
    ll_scan: torch.Tensor | None = None
    #: Of ``wall_s``, seconds spent in the first (tracing) call of each compiled draw, and
    #: the Monte-Carlo samples those calls drew.
    compile_s: float = 0.0
    compile_samples: int = 0


def _eval_blocks(m, n, width, num_samples, budget):
    """``(rows, chunk)``: rows per block and Monte-Carlo samples per chunk, so that one
    vectorised pass holds at most ``budget`` elements (``chunk · M · rows · width``)."""
    per_row = max(1, m * width)
    rows = max(1, min(n, budget // per_row))
    chunk = max(1, min(num_samples, budget // (per_row * rows)))
    return rows, chunk


@torch.no_grad()
def evaluate(
    model,
    guide,
    x,
    y,
    per_split,
    y_mean,
    y_std,
    tau,
    num_samples,
    seed=0,
    keep_samples=False,
    tau_factors=None,
    jit=True,
    budget=None,
    draws="weights",
    kernels=None,
):
    r"""MC-dropout style test metrics of every member, streamed over chunks of samples.

    ``x``: ``(S, N, D)`` inputs standardised with the members' training statistics; ``y``:
    ``(S, N)`` targets on the *original* scale; ``y_mean``, ``y_std``, ``tau``: ``(M,)``.
    Each of the T passes samples fresh pre-activations (local reparameterisation: for the
    dropout guide a fresh dropout mask per example, exactly MC dropout). Predictions are
    un-normalised first; then (float64)

    * RMSE of the MC mean ``(1/T) Σ_t ŷ_t``;
    * LL_i = logsumexp_t(-τ/2 (y_i - ŷ_t)²) - log T - ½ log 2π + ½ log τ, averaged over i
      (``Prediction.log_likelihood``'s formula; the logsumexp is accumulated chunk by chunk);
    * ``rmse_mean_weights``: RMSE of the network with the posterior-mean weights (for dropout,
      standard dropout's weight-averaging test-time net; the reference code's "standard" RMSE);
    * heteroscedastic members (``model.heteroscedastic``): each pass gives a mean and a
      scale per row, the LL is the mixture logsumexp_t log N(y_i; μ_t, σ_t) − log T (``tau``
      unused) and ``Evaluation.tau`` records 1 / (mean over passes and rows of σ²), the
      precision of the average predicted noise (a summary only);
    * ``ll_scan`` (if ``tau_factors``, a ``(K,)`` tensor): the same LL with τ replaced by
      ``tau_factors[k] · τ``, from the same passes (for calibrating τ on validation rows).

    ``draws``: what one pass draws (:data:`MC_DRAWS`).

    * ``"weights"`` (default): one draw of the weights from the guide, applied to every row;
    * ``"examples"``: under local reparameterisation, fresh pre-activations for every row (for
      the dropout guide a fresh mask per example, as Keras' MC dropout in the reference code).

    For any one row the T draws have the same distribution either way (independent draws of
    the posterior predictive; local reparameterisation samples each row's pre-activations from
    their exact marginal), so the per-row LL and the MC mean estimate the same quantities;
    only the correlation *between* rows of a pass differs, which the row averages feel as a
    slightly different Monte-Carlo error (negligible at T = 10,000). ``"weights"`` draws 559
    random numbers per member and pass for 8-50-1 where ``"examples"`` draws 109 per row
    (kin8nm validation: 5x faster).

    Passes are vectorised over chunks of samples and, when one pass of all rows exceeds
    ``budget`` elements (default :data:`_CHUNK_BUDGET`), split into blocks of rows; a block of
    rows is drawn exactly as in a full pass (other random numbers, the same distribution).
    ``jit``: run each pass through a traced graph (see :class:`_Draw`).
    ``kernels``: weight draws through :class:`~benchmarks.uci_fused.FusedDraw`
    (the guide's weights, the forward in a numba kernel, all rows at once): ``None`` (the
    default) where it applies (``jit``, weight draws, one output, CPU tensors, numba
    installed), ``True`` always (``ValueError`` naming why not), ``False`` never.
    """
    if draws not in MC_DRAWS:
        raise ValueError(f"evaluate: draws must be one of {MC_DRAWS}, got {draws!r}")
    start = time.perf_counter()
    pyro.set_rng_seed(seed)
    xm = _expand_members(x, per_split)
    ym = _expand_members(y.double(), per_split)
    m, n = ym.shape
    dev = ym.device
    mu = y_mean.double().reshape(m, 1).to(dev)
    sd = y_std.double().reshape(m, 1).to(dev)
    tau = tau.double().reshape(m, 1).to(dev)
    hetero = getattr(model, "heteroscedastic", False)
    width = xm.shape[-1] + sum(layer.out_features for layer in model.layers)
    budget = _CHUNK_BUDGET if budget is None else budget
    rows, chunk = _eval_blocks(m, n, width, num_samples, budget)
    if kernels is None:
        kernels = (
            jit and draws == "weights" and dev.type == "cpu" and uci_fused.predict_supports(model)
        )
    if kernels:
        if draws != "weights":
            raise ValueError("evaluate(kernels=True) draws weights: pass draws='weights'")
        draw = uci_fused.FusedDraw(model, guide)  # ValueError naming why not
        # the kernel streams the rows: chunks of passes whose (c, M, N) draws fit the budget
        rows, chunk = n, max(1, min(num_samples, budget // max(1, m * n)))
    else:
        draw = _Draw(model, guide, jit)
    total = torch.zeros(m, n, dtype=torch.float64, device=dev)
    lse = torch.full((m, n), -math.inf, dtype=torch.float64, device=dev)
    noise_var = torch.zeros(m, dtype=torch.float64, device=dev)  # heteroscedastic: Σ σ²
    factors = None if tau_factors is None else tau_factors.double().to(dev)
    if factors is not None:
        lse_scan = torch.full((len(factors), m, n), -math.inf, dtype=torch.float64, device=dev)
    kept = []
    with (
        pyro.validation_enabled(False),
        # weight draws: the guide's weights, no pre-activation sampling
        local_reparameterization() if draws == "examples" else contextlib.nullcontext(),
    ):
        for s0 in range(0, num_samples, chunk):
            c = min(chunk, num_samples - s0)
            if hetero:  # each draw's own Gaussian: the mixture LL, no τ
                out = draw(xm, c, rows).double()
                f, s_f = out[..., 0] * sd + mu, out[..., 1] * sd
                total += f.sum(0)
                log_n = -0.5 * ((ym - f) / s_f) ** 2 - s_f.log()
                noise_var += (s_f**2).sum((0, -1))
                lse = torch.logaddexp(lse, torch.logsumexp(log_n, 0))
                if keep_samples:
                    kept.append(f)
                continue
            f = draw(xm, c, rows).double() * sd + mu
            total += f.sum(0)
            sq = (ym - f) ** 2
            lse = torch.logaddexp(lse, torch.logsumexp(-0.5 * tau * sq, 0))
            if factors is not None:  # one τ at a time: K x chunk x M x N would not fit
                for k, fac in enumerate(factors):
                    lse_scan[k] = torch.logaddexp(
                        lse_scan[k], torch.logsumexp(-0.5 * fac * tau * sq, 0)
                    )
            if keep_samples:
                kept.append(f)
    mean = total / num_samples
    rmse = ((ym - mean) ** 2).mean(-1).sqrt()
    const = -math.log(num_samples) - 0.5 * math.log(2 * math.pi)
    ll_i = lse + const + (0.0 if hetero else 0.5 * tau.log())
    if hetero:  # the recorded τ: the precision of the mean predicted noise variance
        tau = (num_samples * n / noise_var).reshape(m, 1)
    ll_scan = None
    if factors is not None:
        ll_scan = (lse_scan + const + 0.5 * (factors.reshape(-1, 1, 1) * tau).log()).mean(-1)
    with pyro.validation_enabled(False):
        medians = guide.median()
        f_mw = poutine.condition(model, data=medians)(xm)
        f_mean_w = (f_mw[..., 0] if hetero else f_mw).reshape(m, n).double() * sd + mu
    rmse_mw = ((ym - f_mean_w) ** 2).mean(-1).sqrt()
    return Evaluation(
        rmse=rmse,
        ll=ll_i.mean(-1),
        rmse_mean_weights=rmse_mw,
        tau=tau.reshape(-1),
        wall_s=time.perf_counter() - start,
        samples=torch.cat(kept, 0) if keep_samples else None,
        ll_scan=ll_scan,
        compile_s=draw.compile_s,
        compile_samples=draw.compile_samples,
    )

"""The UCI benchmark's faster engine against the eager one it replaced.

Training: the compiled ELBO (``JitMeanFieldELBO``) is the eager estimator (its traced graph
drops the guide's unused weight draws, so the random streams differ: checked in distribution,
loss and gradients), and the fused Adam takes exactly Pyro's steps. Evaluation: with one full
eager pass per chunk it reproduces the previous loop bit for bit; blocks of rows through a
traced graph give draws with the same distribution.
"""

import math
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine

from benchmarks import uci, uci_model
from pyro_dropout import Prediction, local_reparameterization
from pyro_dropout.datasets import load_uci
from pyro_dropout.infer import JitMeanFieldELBO, MeanFieldELBO
from pyro_dropout.nn.likelihoods import GaussianLikelihood

pytestmark = pytest.mark.usefixtures("one_thread")

UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


@pytest.fixture(scope="module")
def yacht():
    if not (UCI_DIR / "yacht" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    return load_uci("yacht", UCI_DIR)


def _build(ds, guide, splits=(0, 1)):
    configs = uci_model.grid(guide, ds.dropout_rates, ds.tau_values, quick=True)
    x, y, xt, yt, mean, std = uci._stack_split_arrays(ds, list(splits), validation=False)
    g = len(configs)
    members = uci_model.Members(
        [c for _ in splits for c in configs], std.repeat_interleave(g), x.shape[1]
    )
    model, guide_, eval_tau = uci_model.build(guide, ds.n_features, ds.n_hidden, members)
    test = (xt, yt, mean.repeat_interleave(g), std.repeat_interleave(g))
    return model, guide_, eval_tau, (x, y), test, g


def _loss_and_grads(elbo, model, guide, xb, yb, n, params, seed):
    pyro.set_rng_seed(seed)
    loss = elbo.differentiable_loss(model, guide, xb, yb, num_data=n)
    grads = torch.autograd.grad(loss, params)
    return loss.detach(), torch.cat([g.reshape(-1) for g in grads])


def _z(a, b):
    """Largest |difference of means| / its standard error, over the columns of a and b."""
    se = (a.var(0) / len(a) + b.var(0) / len(b)).sqrt()
    diff = (a.mean(0) - b.mean(0)).abs()
    scale = torch.maximum(a.abs().mean(0), b.abs().mean(0))
    exact = se <= 1e-6 * scale  # no noise (e.g. a deterministic gradient): must agree
    assert (diff[exact] <= 1e-4 * scale[exact] + 1e-6).all()
    return float((diff[~exact] / se[~exact]).max()) if (~exact).any() else 0.0


@pytest.mark.parametrize("guide", ["dropout", "meanfield", "vd", "concrete"])
def test_compiled_loss_is_the_eager_estimator(yacht, guide):
    """Over 150 seeds each, the compiled and the eager loss (and every gradient element) have
    the same mean within 5 standard errors, at trained (not initial) parameters."""
    model, g, _, (x, y), _, per = _build(yacht, guide)
    uci_model.train(model, g, x, y, per, 2, lr=1e-2, seed=0, jit=False)
    n = x.shape[1]
    xb = uci_model._expand_members(x[:, :100], per)
    yb = uci_model._expand_members(y[:, :100], per)
    params = [p for _, p in sorted(g.named_parameters())]
    runs = {}
    for cls in (MeanFieldELBO, JitMeanFieldELBO):
        elbo = cls(max_plate_nesting=2)
        with (
            pyro.validation_enabled(False),
            local_reparameterization(),
            torch.jit.optimized_execution(False),  # as train() runs it
        ):
            draws = [_loss_and_grads(elbo, model, g, xb, yb, n, params, s) for s in range(150)]
        runs[cls] = [torch.stack(t).double() for t in zip(*draws, strict=True)]
    (loss_e, grad_e), (loss_j, grad_j) = runs[MeanFieldELBO], runs[JitMeanFieldELBO]
    assert _z(loss_e[:, None], loss_j[:, None]) < 5
    assert _z(grad_e, grad_j) < 5
    # and the comparison has power: a 5 % change of the loss would be seen
    assert _z(loss_e[:, None], 1.05 * loss_j[:, None]) > 5


@pytest.mark.parametrize("jit", [False, True])
def test_fused_adam_takes_pyros_adam_steps(yacht, jit):
    fits = []
    for fused in (False, True):
        model, g, *_, (x, y), _, per = _build(yacht, "dropout")
        stats = uci_model.train(model, g, x, y, per, 2, lr=1e-2, seed=3, jit=jit, fused=fused)
        fits.append((stats.final_loss, {k: v.detach().clone() for k, v in g.median().items()}))
    (loss_a, med_a), (loss_b, med_b) = fits
    assert math.isclose(loss_a, loss_b, rel_tol=1e-6)
    for k in med_a:
        torch.testing.assert_close(med_a[k], med_b[k], rtol=1e-5, atol=1e-6)


def test_compiled_training_times_its_tracing_steps_apart(yacht):
    model, g, *_, (x, y), _, per = _build(yacht, "meanfield")
    assert x.shape[1] % 128 != 0  # the last batch of an epoch is smaller: two shapes
    stats = uci_model.train(model, g, x, y, per, 3, seed=0)  # compiled by default
    assert stats.jit and math.isfinite(stats.final_loss)
    assert stats.warm_steps == 2 * uci_model._WARM_STEPS
    assert 0 < stats.compile_s < stats.wall_s
    model, g, *_ = _build(yacht, "meanfield")
    again = uci_model.train(model, g, x, y, per, 3, seed=0)
    assert again.final_loss == stats.final_loss  # the seed alone decides the fit
    model, g, *_ = _build(yacht, "meanfield")
    eager = uci_model.train(model, g, x, y, per, 3, seed=0, jit=False)
    assert not eager.jit and eager.warm_steps == 0 and eager.compile_s == 0


def _previous_evaluate(model, guide, x, y, per_split, y_mean, y_std, tau, num_samples, seed):
    """``evaluate``'s sampling loop before row blocks and tracing (commit 7a705c7)."""
    pyro.set_rng_seed(seed)
    xm = uci_model._expand_members(x, per_split)
    ym = uci_model._expand_members(y.double(), per_split)
    m, n = ym.shape
    mu, sd = y_mean.double().reshape(m, 1), y_std.double().reshape(m, 1)
    tau = tau.double().reshape(m, 1)
    width = xm.shape[-1] + sum(layer.out_features for layer in model.layers)
    chunk = max(1, min(num_samples, uci_model._CHUNK_BUDGET // max(1, m * n * width)))
    total = torch.zeros(m, n, dtype=torch.float64)
    lse = torch.full((m, n), -math.inf, dtype=torch.float64)
    with torch.no_grad(), pyro.validation_enabled(False), local_reparameterization():
        for s0 in range(0, num_samples, chunk):
            c = min(chunk, num_samples - s0)
            with pyro.plate("_mc_samples", c, dim=-3):
                trace = poutine.trace(guide).get_trace(xm)
                f = poutine.replay(model, trace=trace)(xm)
            f = f.reshape(c, m, n).double() * sd + mu
            total += f.sum(0)
            lse = torch.logaddexp(lse, torch.logsumexp(-0.5 * tau * (ym - f) ** 2, 0))
    rmse = ((ym - total / num_samples) ** 2).mean(-1).sqrt()
    const = -math.log(num_samples) - 0.5 * math.log(2 * math.pi)
    ll = lse + const + 0.5 * tau.log()
    return rmse, ll.mean(-1)


@pytest.mark.parametrize("guide", ["dropout", "meanfield"])
def test_one_eager_pass_per_chunk_is_the_previous_evaluate(yacht, guide):
    model, g, eval_tau, (x, y), (xt, yt, mean, std), per = _build(yacht, guide)
    uci_model.train(model, g, x, y, per, 2, lr=1e-2, seed=0)
    tau, m, n = eval_tau(), len(eval_tau()), xt.shape[1]
    width = xt.shape[-1] + sum(layer.out_features for layer in model.layers)
    assert m * n * width <= uci_model._CHUNK_BUDGET  # one block of rows: the previous loop
    ev = uci_model.evaluate(
        model, g, xt, yt, per, mean, std, tau, 300, seed=5, jit=False, draws="examples"
    )
    rmse, ll = _previous_evaluate(model, g, xt, yt, per, mean, std, tau, 300, seed=5)
    assert torch.equal(ev.rmse, rmse) and torch.equal(ev.ll, ll)


@pytest.mark.parametrize("draws", uci_model.MC_DRAWS)
@pytest.mark.parametrize("guide", ["dropout", "meanfield"])
def test_blocked_compiled_draws_have_the_full_pass_distribution(yacht, guide, draws):
    """Per member and test row: mean and variance of 1500 predictive draws agree (within 5
    standard errors) between full eager passes and compiled passes over 3 blocks of rows; the
    metrics of the blocked run follow ``Prediction``'s formulas."""
    model, g, eval_tau, (x, y), (xt, yt, mean, std), per = _build(yacht, guide)
    uci_model.train(model, g, x, y, per, 2, lr=1e-2, seed=0)
    tau, t = eval_tau(), 1500
    m, n = len(tau), xt.shape[1]
    width = xt.shape[-1] + sum(layer.out_features for layer in model.layers)
    rows = math.ceil(n / 3)
    assert uci_model._eval_blocks(m, n, width, t, m * width * rows) == (rows, 1)
    args = (model, g, xt, yt, per, mean, std, tau, t)
    full = uci_model.evaluate(
        *args, seed=1, keep_samples=True, jit=False, budget=2**40, draws=draws
    )
    blocked = uci_model.evaluate(
        *args, seed=2, keep_samples=True, jit=True, budget=m * width * rows, draws=draws
    )
    a, b = full.samples.flatten(1), blocked.samples.flatten(1)  # (T, M·N)
    assert _z(a, b) < 5
    # variances: the standard error of a sample variance from the fourth central moment
    va, vb = a.var(0), b.var(0)
    se = (((a - a.mean(0)) ** 4).mean(0) / t + ((b - b.mean(0)) ** 4).mean(0) / t).sqrt()
    assert float(((va - vb).abs() / se).max()) < 5
    torch.testing.assert_close(full.rmse_mean_weights, blocked.rmse_mean_weights)
    y_members = yt.repeat_interleave(per, 0)
    for k in range(m):
        pred = Prediction(blocked.samples[:, k, :, None], GaussianLikelihood(tau=float(tau[k])))
        torch.testing.assert_close(blocked.ll[k], pred.log_likelihood(y_members[k]).mean())
        rmse = ((pred.mean[:, 0] - y_members[k]) ** 2).mean().sqrt()
        torch.testing.assert_close(blocked.rmse[k], rmse)


def _duplicated_rows(xt, yt, at):
    """The test rows with row 0 copied to position ``at`` (a row of another block)."""
    x2, y2 = xt.clone(), yt.clone()
    x2[:, at], y2[:, at] = xt[:, 0], yt[:, 0]
    return x2, y2


@pytest.mark.parametrize("guide", ["dropout", "meanfield", "vd", "concrete"])
def test_weight_draws_apply_one_draw_to_every_row_of_a_pass(yacht, guide):
    """Two copies of one input row, in different blocks of rows: with ``draws="weights"`` every
    pass predicts the same value for both (one weight draw for the whole pass, shared by the
    blocks), with ``draws="examples"`` the copies get their own draws."""
    model, g, eval_tau, (x, y), (xt, yt, mean, std), per = _build(yacht, guide)
    uci_model.train(model, g, x, y, per, 2, lr=1e-2, seed=0)
    tau, n = eval_tau(), xt.shape[1]
    m = len(tau)
    width = xt.shape[-1] + sum(layer.out_features for layer in model.layers)
    x2, y2 = _duplicated_rows(xt, yt, n - 1)
    budget = m * width * math.ceil(n / 3)  # three blocks: row 0 and row n-1 in different ones
    for jit in (False, True):
        args = (model, g, x2, y2, per, mean, std, tau, 40)
        w = uci_model.evaluate(*args, keep_samples=True, jit=jit, budget=budget, draws="weights")
        e = uci_model.evaluate(*args, keep_samples=True, jit=jit, budget=budget, draws="examples")
        torch.testing.assert_close(w.samples[..., 0], w.samples[..., n - 1])
        assert (e.samples[..., 0] - e.samples[..., n - 1]).abs().min() > 0
        assert w.samples[:, :, 0].std(0).min() > 0  # and the passes differ


@pytest.mark.parametrize("guide", ["dropout", "meanfield", "vd", "concrete"])
def test_weight_and_example_draws_agree_in_distribution(yacht, guide):
    """Per member and test row, the mean and variance of 2000 predictive draws agree (within 5
    standard errors) between ``draws="weights"`` and ``draws="examples"``; so do the members'
    LL and RMSE, over 8 seeds of 250 passes each (the issue's "numbers must not move")."""
    model, g, eval_tau, (x, y), (xt, yt, mean, std), per = _build(yacht, guide)
    uci_model.train(model, g, x, y, per, 3, lr=1e-2, seed=0)
    tau = eval_tau()
    args = (model, g, xt, yt, per, mean, std, tau)
    a = uci_model.evaluate(*args, 2000, seed=1, keep_samples=True, draws="weights")
    b = uci_model.evaluate(*args, 2000, seed=2, keep_samples=True, draws="examples")
    a, b = a.samples.flatten(1), b.samples.flatten(1)
    assert _z(a, b) < 5
    se = (((a - a.mean(0)) ** 4).mean(0) / len(a) + ((b - b.mean(0)) ** 4).mean(0) / len(b)).sqrt()
    assert float(((a.var(0) - b.var(0)).abs() / se).max()) < 5
    metrics = {}
    for draws in uci_model.MC_DRAWS:
        runs = [uci_model.evaluate(*args, 250, seed=10 + s, draws=draws) for s in range(8)]
        metrics[draws] = torch.stack([torch.cat([r.ll, r.rmse]) for r in runs])
    assert _z(metrics["weights"], metrics["examples"]) < 5


def test_unknown_draws_are_refused(yacht):
    model, g, eval_tau, _, (xt, yt, mean, std), per = _build(yacht, "dropout")
    with pytest.raises(ValueError, match="draws must be one of"):
        uci_model.evaluate(model, g, xt, yt, per, mean, std, eval_tau(), 5, draws="rows")

"""The UCI engine's fused mean-field loss (numba kernels) against the Pyro loss it replaces.

Given the same noise the two are the same function of the parameters: the loss and every
gradient agree to float rounding, and one training step moves every parameter alike. Where the
kernels do not apply, training says which engine ran and ``kernels=True`` says why not.
"""

import contextlib
import math

import numpy as np
import pyro
import pytest
import torch
from scipy import stats

from benchmarks import uci_fused, uci_model
from benchmarks.uci_fused import kernels
from benchmarks.uci_fused.gradients import ManualGradients
from pyro_dropout import local_reparameterization
from pyro_dropout.infer import FusedOptim, MeanFieldELBO, fused_adam

pytestmark = [
    pytest.mark.skipif(not uci_fused.available(), reason="numba is not installed"),
    pytest.mark.usefixtures("one_thread"),
]

M_CONFIGS = [{"prior_scale": s, "noise": n} for s in (0.3, 3.0) for n in (1.0, "learned")]
C_CONFIGS = [{"noise": "learned"}] * 4
V_CONFIGS = [{"noise": n} for n in (1.0, "learned", 30.0, "learned")]
D_CONFIGS = [{"dropout_rate": p, "tau": t} for p in (0.05, 0.5) for t in (0.5, 20.0)]


def _meanfield(d=3, hidden=7, n=40, configs=M_CONFIGS, seed=0, guide="meanfield"):
    torch.manual_seed(seed)
    members = uci_model.Members(configs, torch.linspace(0.5, 2.0, len(configs)).double(), n)
    model, guide, _ = uci_model.build(guide, d, hidden, members)
    return model, guide


def _dropout(**kwargs):
    return _meanfield(configs=D_CONFIGS, guide="dropout", **kwargs)


def _vd(**kwargs):
    return _meanfield(configs=V_CONFIGS, guide="vd", **kwargs)


def _concrete(**kwargs):
    return _meanfield(configs=C_CONFIGS, guide="concrete", **kwargs)


BUILD = {"meanfield": _meanfield, "dropout": _dropout, "vd": _vd, "concrete": _concrete}


@contextlib.contextmanager
def _same_noise():
    """``torch.randn`` and ``torch.rand`` (and ``Tensor.normal_`` in place) hand out one fixed
    tensor per number of elements, so that the Pyro loss and the fused one use the same masks
    and pre-activation noise."""
    real = {"randn": torch.randn, "rand": torch.rand}
    drawn = {"randn": {}, "rand": {}}

    def fixed(kind):
        def draw(*size, **kwargs):
            one = len(size) == 1 and not isinstance(size[0], int)
            shape = torch.Size(size[0] if one else size)
            if shape.numel() not in drawn[kind]:
                drawn[kind][shape.numel()] = real[kind](shape, **kwargs)
            # a copy: the masks are made in place from the uniforms (``rand(...).lt_(keep)``)
            return drawn[kind][shape.numel()].reshape(shape).clone()

        return draw

    real_normal_ = torch.Tensor.normal_

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        # a kept tensor refilled in place (the hand-written step): the same fixed draws
        if mean != 0.0 or std != 1.0 or generator is not None:
            return real_normal_(self, mean, std, generator=generator)
        return self.copy_(fixed("randn")(self.shape, dtype=self.dtype))

    torch.randn, torch.rand = fixed("randn"), fixed("rand")
    torch.Tensor.normal_ = normal_
    try:
        yield drawn
    finally:
        torch.randn, torch.rand = real["randn"], real["rand"]
        torch.Tensor.normal_ = real_normal_


def _setup(model, guide, x, y, n, spread=0.5, seed=1):
    """Build the guide, then move every parameter off its initial value (so that the posterior
    scales, the learned noise and some ReLUs' signs all differ between members)."""
    pyro.clear_param_store()
    with local_reparameterization():
        guide(x, y, num_data=n)
    params = dict(pyro.get_param_store().named_parameters())
    _perturb(params, spread, seed)
    return params


def _perturb(params, spread, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params.values():
            p.add_(spread * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("guide_name", ["meanfield", "dropout", "vd", "concrete"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,num_data", [(16, 40), (5, 5)])
def test_fused_loss_is_the_pyro_loss_given_the_noise(guide_name, dtype, batch, num_data):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model, guide = BUILD[guide_name](n=num_data)
        x, y = torch.randn(len(M_CONFIGS), batch, 3), torch.randn(len(M_CONFIGS), batch)
        params = _setup(model, guide, x, y, num_data)
        # the first call prepares the closed-form KL: compare at other parameters
        uci_fused.fused_loss(model, guide, x, y, num_data=num_data)
        _perturb(params, 0.3, seed=2)
        names = sorted(params)
        with _same_noise() as drawn:
            with local_reparameterization(), pyro.validation_enabled(False):
                ref = MeanFieldELBO(max_plate_nesting=2).differentiable_loss(
                    model, guide, x, y, num_data=num_data
                )
            ref_grads = torch.autograd.grad(ref, [params[k] for k in names])
            fused = uci_fused.fused_loss(model, guide, x, y, num_data=num_data, rng="torch")
            grads = torch.autograd.grad(fused, [params[k] for k in names])
        # both used the same noise: the hidden units' and the outputs' (and the masks)
        m = len(M_CONFIGS)
        assert {m * batch, m * batch * 7} <= set(drawn["randn"])
        if guide_name in ("dropout", "concrete"):
            assert {m * batch * 3, m * batch * 7} <= set(drawn["rand"])
    finally:
        torch.set_default_dtype(default)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert fused.dtype == dtype
    assert math.isclose(fused.item(), ref.item(), rel_tol=tol)
    for name, a, b in zip(names, ref_grads, grads, strict=True):
        assert a.abs().max() > 0 or "scales" in name, name  # dropout: σ is fixed
        torch.testing.assert_close(b, a, rtol=tol, atol=tol * a.abs().max().item(), msg=name)


@pytest.mark.parametrize("build", [_meanfield, _dropout, _vd, _concrete])
def test_fused_loss_differs_when_the_noise_does(build):
    """The equality above has power: with other noise the losses differ."""
    model, guide = build()
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    _setup(model, guide, x, y, 40)
    with _same_noise():
        a = uci_fused.fused_loss(model, guide, x, y, num_data=40, rng="torch")
    b = uci_fused.fused_loss(model, guide, x, y, num_data=40, rng="torch")
    assert not math.isclose(a.item(), b.item(), rel_tol=1e-4)


@pytest.mark.parametrize("build", [_meanfield, _dropout, _vd, _concrete])
def test_fused_step_moves_every_parameter_as_svi_does(build):
    """One step of ``FusedSVI`` and one of Pyro's ``SVI`` with the eager loss, from
    the same parameters with the same noise, leave the same parameters."""
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    after = []
    for fused in (False, True):
        model, guide = build()
        _setup(model, guide, x, y, 40)
        optim = FusedOptim(torch.optim.SGD, {"lr": 1e-4})  # a step is the gradient
        if fused:
            svi = uci_fused.FusedSVI(model, guide, optim, rng="torch")
        else:
            svi = pyro.infer.SVI(model, guide, optim, MeanFieldELBO(max_plate_nesting=2))
        with _same_noise(), local_reparameterization(), pyro.validation_enabled(False):
            loss = svi.step(x, y, num_data=40)
        # names without the guide's instance prefix ("AutoMeanField_5.")
        store = pyro.get_param_store().named_parameters()
        params = {k.split(".", 1)[-1]: p.detach().clone() for k, p in store}
        after.append((loss, params))
    (loss_a, a), (loss_b, b) = after
    assert math.isclose(loss_a, loss_b, rel_tol=1e-5)
    assert sorted(a) == sorted(b)
    assert any("learned_sd" in k for k in a) == (build is not _dropout)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_train_uses_the_kernels_where_they_apply_and_says_so():
    x, y = torch.randn(2, 30, 3), torch.randn(2, 30)
    model, guide = _meanfield(configs=M_CONFIGS[:2] * 2, n=30)
    stats = uci_model.train(model, guide, x, y, 2, 2, batch_size=16, seed=0)
    assert stats.engine == "fused" and math.isfinite(stats.final_loss)
    # the same seed gives the same fit
    model, guide = _meanfield(configs=M_CONFIGS[:2] * 2, n=30)
    again = uci_model.train(model, guide, x, y, 2, 2, batch_size=16, seed=0)
    assert again.final_loss == stats.final_loss
    model, guide = _meanfield(configs=M_CONFIGS[:2] * 2, n=30)
    assert uci_model.train(model, guide, x, y, 2, 1, kernels=False).engine == "traced"
    model, guide = _meanfield(configs=M_CONFIGS[:2] * 2, n=30)
    assert uci_model.train(model, guide, x, y, 2, 1, jit=False).engine == "eager"


def test_the_kernels_say_what_they_cannot_train(monkeypatch):
    members = uci_model.Members([{"noise": "learned"}], torch.ones(1).double(), 9)
    model, guide, _ = uci_model.build("concrete", 3, 5, members)
    guide.rate_per = "unit"
    assert "rate_per='layer'" in uci_fused.unsupported_reason(model, guide)
    x, y = torch.randn(1, 9, 3), torch.randn(1, 9)
    with pytest.raises(ValueError, match="kernels=True: .*one rate per layer"):
        uci_model.train(model, guide, x, y, 1, 1, kernels=True)
    assert uci_model.train(model, guide, x, y, 1, 1).engine == "traced"
    model, guide = _dropout()
    assert uci_fused.supports(model, guide)
    guide.learn_scale = True
    assert "fixed slab scale" in uci_fused.unsupported_reason(model, guide)
    hetero = uci_model.Members([{"noise": "heteroscedastic"}], torch.ones(1).double(), 9)
    model, guide, _ = uci_model.build("meanfield-hetero", 3, 5, hetero)
    assert "heteroscedastic" in uci_fused.unsupported_reason(model, guide)
    model, guide = _meanfield()
    assert uci_fused.supports(model, guide)
    with pytest.raises(ValueError, match="CPU tensors"):
        uci_fused.fused_loss(model, guide, torch.randn(4, 2, 3, device="meta"), None)
    monkeypatch.setattr(uci_fused.kernels, "numba", None)
    assert "numba is not installed" in uci_fused.unsupported_reason(model, guide)
    with pytest.raises(ValueError, match="numba is not installed"):
        uci_fused.FusedSVI(model, guide, fused_adam({"lr": 1e-3}))


def test_the_cli_says_when_numba_is_missing(monkeypatch, capsys, tmp_path):
    from benchmarks.uci import cli

    monkeypatch.setattr(uci_fused.kernels, "numba", None)

    def resolve(args, parser):  # no data: only the guides are read
        args.guide_names = args.guides.split(",")
        return [], {}

    monkeypatch.setattr(cli, "_resolve", resolve)
    monkeypatch.setattr(cli, "run", lambda args, datasets, per_ds: {})
    (tmp_path / "results.md").write_text("")
    cli.main(["--data-dir", str(tmp_path), "--guides", "meanfield", "--out", str(tmp_path)])
    assert "numba is not installed" in capsys.readouterr().err
    cli.main(["--data-dir", str(tmp_path), "--guides", "dropout-hetero", "--out", str(tmp_path)])
    assert "numba" not in capsys.readouterr().err  # the heteroscedastic variants have none


def _draws(loss_fn, params, seeds):
    losses, grads = [], []
    for seed in seeds:
        pyro.set_rng_seed(seed)
        loss = loss_fn()
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        losses.append(loss.detach())
    return torch.stack(losses).double()[:, None], torch.stack(grads).double()


def _z(a, b):
    """Largest |difference of means| / its standard error over the columns; infinite when a
    column without noise differs."""
    se = (a.var(0) / len(a) + b.var(0) / len(b)).sqrt()
    diff = (a.mean(0) - b.mean(0)).abs()
    noisy = se > 1e-6 * a.abs().mean(0).clamp_min(1e-12)
    if not torch.allclose(a.mean(0)[~noisy], b.mean(0)[~noisy], rtol=1e-4, atol=1e-9):
        return math.inf
    return float((diff[noisy] / se[noisy]).max())


def _same_mean_under_both_rngs(model, guide):
    """Assert that the loss and every gradient element have the same mean (400 seeds each,
    within 5 standard errors) with the kernels' random draws as with torch's; returns the
    loss factory, the parameters and torch's draws."""
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    params = [p for p in _setup(model, guide, x, y, 40, spread=0.3).values() if p.requires_grad]

    def loss(rng):
        return lambda: uci_fused.fused_loss(model, guide, x, y, num_data=40, rng=rng)

    torch_draws = _draws(loss("torch"), params, range(400))
    kernel_draws = _draws(loss("kernel"), params, range(1000, 1400))
    assert _z(torch_draws[0], kernel_draws[0]) < 5
    assert _z(torch_draws[1], kernel_draws[1]) < 5
    return loss, params, torch_draws


def test_kernel_masks_are_torchs_masks_in_distribution():
    """The kernels' counter-based mask draws give the loss and every gradient element the
    same mean as ``torch.rand``'s masks (400 seeds each, within 5 standard errors), and the
    check has power: a keep probability off by 0.05 is seen."""
    model, guide = _dropout(n=40)
    loss, params, torch_draws = _same_mean_under_both_rngs(model, guide)
    # power: drop rates 0.05 / 0.5 -> 0.1 / 0.55 in the kernel's draws
    guide._rates = {k: v + 0.05 for k, v in guide._rates.items()}  # the sites' rates
    shifted = _draws(loss("kernel"), params, range(2000, 2400))
    assert max(_z(torch_draws[0], shifted[0]), _z(torch_draws[1], shifted[1])) > 5


@pytest.mark.parametrize("name", ["meanfield", "vd", "concrete"])
def test_kernel_normals_are_torchs_normals_in_distribution(name):
    """The kernels' normal draws (``fill_normal``) give the loss and every gradient element
    the same mean as ``normal_``'s (400 seeds each, within 5 standard errors)."""
    _same_mean_under_both_rngs(*BUILD[name](n=40))


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _box_muller_reference(n, seed):
    """``fill_normal``'s draws computed apart, in float64 numpy: SplitMix64's stream of
    ``seed``, 24-bit uniforms, Box-Muller with numpy's log, cos and sin."""
    pairs = (n + 1) // 2
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(pairs, dtype=np.uint64) * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    u1 = ((z >> np.uint64(40)) + np.uint64(1)).astype(np.float64) * 2.0**-24
    u2 = ((z >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.float64) * 2.0**-24
    r, theta = np.sqrt(-2 * np.log(u1)), 2 * np.pi * (u2 - 0.5)
    return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 2049, 2050, 300_001])
def test_fill_normal_is_box_muller_on_the_splitmix_stream(n):
    """The polynomial log, cos and sin of the kernel against numpy's, on the same stream, to
    2e-6 (float32 rounding), for lengths odd and even, below and across a chunk."""
    out = np.full(n, np.nan, dtype=np.float32)
    kernels.compiled()["fill_normal"](out, np.uint64(12345))
    np.testing.assert_allclose(out, _box_muller_reference(n, 12345), rtol=0, atol=2e-6)
    # a float64 array gets the same draws
    out64 = np.empty(n)
    kernels.compiled()["fill_normal"](out64, np.uint64(12345))
    np.testing.assert_allclose(out64, out, rtol=0, atol=1e-7)


def test_fill_normal_draws_standard_normals():
    """Two million draws: N(0, 1) by Kolmogorov-Smirnov, mean, variance, tail mass beyond 3
    and no correlation between the two draws of a pair or between seeds (each within 5
    standard errors: a variance off by 1 % is 7 of them)."""
    n = 2_000_000
    fill = kernels.compiled()["fill_normal"]
    a, b = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    fill(a, np.uint64(7))
    fill(b, np.uint64(8))
    z = a.astype(np.float64)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    tail = 2 * stats.norm.sf(3)
    assert abs((np.abs(z) > 3).mean() - tail) < 5 * math.sqrt(tail * (1 - tail) / n)
    half = n // 2
    assert abs(np.corrcoef(z[:half], z[half:])[0, 1]) < 5 / math.sqrt(half)
    assert abs(np.corrcoef(z, b)[0, 1]) < 5 / math.sqrt(n)
    assert np.abs(z).max() <= math.sqrt(48 * math.log(2)) + 1e-5


def test_kernel_masks_differ_between_steps_and_repeat_with_the_seed():
    model, guide = _dropout(n=40)
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    _setup(model, guide, x, y, 40)
    pyro.set_rng_seed(5)
    a = [uci_fused.fused_loss(model, guide, x, y, num_data=40).item() for _ in range(2)]
    pyro.set_rng_seed(5)
    b = [uci_fused.fused_loss(model, guide, x, y, num_data=40).item() for _ in range(2)]
    assert a == b and a[0] != a[1]
    with pytest.raises(ValueError, match="rng must be"):
        uci_fused.fused_loss(model, guide, x, y, num_data=40, rng="numpy")


def test_closed_form_kl_follows_a_new_prototype_or_new_rates():
    model, guide = _dropout(n=40)
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    _setup(model, guide, x, y, 40)
    uci_fused.fused_loss(model, guide, x, y, num_data=40)
    plan = guide._fused_kl
    assert plan.valid_for(guide)
    guide._rates = {k: v * 1.5 for k, v in guide._rates.items()}  # the sites' rates
    assert not plan.valid_for(guide)
    with _same_noise():
        with local_reparameterization(), pyro.validation_enabled(False):
            ref = MeanFieldELBO(max_plate_nesting=2).differentiable_loss(
                model, guide, x, y, num_data=40
            )
        fused = uci_fused.fused_loss(model, guide, x, y, num_data=40, rng="torch")
    assert guide._fused_kl is not plan
    assert math.isclose(fused.item(), ref.item(), rel_tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("build", [_meanfield, _dropout, _vd, _concrete])
def test_manual_gradients_are_autograds(build, dtype):
    """The hand-written gradients of mean-field and MC dropout (no graph) are autograd's of
    ``fused_loss``, for every parameter, given the same noise and masks."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model, guide = build()
        x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
        params = _setup(model, guide, x, y, 40)
        uci_fused.fused_loss(model, guide, x, y, num_data=40)  # prepares the closed-form KL
        _perturb(params, 0.3, seed=3)
        if build is _vd:  # θ = 0 puts log α above its clip range: no KL gradient there
            with torch.no_grad():
                next(p for k, p in params.items() if k.endswith("locs.layers.0.weight"))[
                    0, 0, :2
                ] = 0
        manual = ManualGradients(model, guide)
        with _same_noise():
            loss, grads = manual(x, y, 40, "torch")
            ref = uci_fused.fused_loss(model, guide, x, y, num_data=40, rng="torch")
            names = sorted(params)
            ref_grads = torch.autograd.grad(ref, [params[k] for k in names])
    finally:
        torch.set_default_dtype(default)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert math.isclose(loss, ref.item(), rel_tol=tol)
    assert set(grads) == {params[k] for k in names}
    for k, g in zip(names, ref_grads, strict=True):
        if g.abs().max() == 0:  # dropout's fixed scales have no gradient and take no step
            assert k.endswith("learned_sd") or "scales" in k
            continue
        got = grads[params[k]]
        assert got.shape == g.shape and got.is_contiguous()  # fused optimisers need it
        torch.testing.assert_close(got, g, rtol=tol, atol=tol * g.abs().max().item(), msg=k)


@pytest.mark.parametrize("guide_name", ["meanfield", "dropout", "vd", "concrete"])
def test_fused_draw_is_the_model_on_the_guides_weights(guide_name):
    """Given the same seed, the kernel's Monte-Carlo passes are the model replayed on the same
    weight draws of the guide (any guide: the kernel only runs the network)."""
    model, guide = BUILD[guide_name]()
    x, y = torch.randn(4, 16, 3), torch.randn(4, 16)
    _setup(model, guide, x, y, 40, spread=0.2)
    pyro.set_rng_seed(3)
    with torch.no_grad(), pyro.validation_enabled(False):
        fused = uci_fused.FusedDraw(model, guide)(x, 5)
    pyro.set_rng_seed(3)
    with torch.no_grad(), pyro.validation_enabled(False):
        ref = uci_model._Draw(model, guide, jit=False)._eager(x, 5, 16)
    assert fused.shape == ref.shape == (5, 4, 16)
    assert fused.std(0).min() > 0  # the passes differ
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)


def test_evaluate_says_when_the_fused_draw_cannot_serve():
    hetero = uci_model.Members([{"noise": "heteroscedastic"}], torch.ones(1).double(), 9)
    model, guide, _ = uci_model.build("meanfield-hetero", 3, 5, hetero)
    x, y = torch.randn(1, 9, 3), torch.randn(1, 9)
    guide(x, y)
    args = (model, guide, x, y, 1, torch.zeros(1), torch.ones(1), torch.ones(1), 4)
    with pytest.raises(ValueError, match="heteroscedastic"):
        uci_model.evaluate(*args, kernels=True)
    assert uci_model.evaluate(*args).ll.isfinite().all()  # the traced draw serves it
    model, guide = _meanfield()
    guide(torch.randn(4, 9, 3), torch.randn(4, 9))
    args = (model, guide, torch.randn(4, 9, 3), torch.randn(4, 9), 1, torch.zeros(4))
    with pytest.raises(ValueError, match="draws weights"):
        uci_model.evaluate(*args, torch.ones(4), torch.ones(4), 4, kernels=True, draws="examples")

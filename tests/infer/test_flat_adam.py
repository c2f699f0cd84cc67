"""``FusedOptim``'s flat Adam (fit's default optimiser): torch's Adam update on one buffer, and
the hand-over to ``torch.optim.Adam`` wherever the flat step would not be exact."""

import pyro
import pytest
import torch
from pyro.infer import SVI

from pyro_dropout import AutoDropout, BayesianMLP, local_reparameterization
from pyro_dropout.infer import CompiledSVI, FusedOptim, JitMeanFieldELBO, fused_adam
from pyro_dropout.infer.flat_adam import FlatAdam, flat_adam_args

SHAPES = [(5, 3), (5,), (1, 5), (1,), (4, 2, 3)]


def _params(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in SHAPES]


def _grads(params, step):
    for p in params:
        p.grad = torch.sin(p.detach() * (step + 1)) + 0.1


def _run(args, steps, dtype=torch.float32, between=None, kernel=None):
    """``FusedOptim(Adam, args)`` against ``torch.optim.Adam`` with the kernel FusedOptim
    picks (fused unless ``args`` say otherwise; ``kernel`` names another) on the same
    gradients; returns both parameter lists, the ``FusedOptim`` and torch's optimiser."""
    ours, ref = _params(dtype), _params(dtype)
    fused = FusedOptim(torch.optim.Adam, dict(args))
    torch_args = {k: v for k, v in args.items() if k not in ("fused", "foreach")}
    if kernel is None:
        kernel = {"fused": True} if args.get("fused", True) else {"foreach": False}
    opt = torch.optim.Adam(ref, **kernel, **torch_args)
    for step in range(steps):
        _grads(ours, step)
        _grads(ref, step)
        if between is not None:
            between(step, ours, fused)
            between(step, ref, None)
        fused(ours)
        opt.step()
    return ours, ref, fused, opt


@pytest.mark.parametrize(
    "args, dtype",
    [
        ({"lr": 0.01}, torch.float32),
        ({"lr": 0.01, "weight_decay": 0.1, "eps": 1e-6}, torch.float32),
        ({"lr": 0.003, "betas": (0.8, 0.95)}, torch.float64),
        ({"lr": 0.01, "weight_decay": 0.1, "fused": False, "foreach": False}, torch.float32),
        ({"lr": 0.003, "betas": (0.8, 0.95), "fused": False}, torch.float64),
    ],
    ids=["adam", "decay", "float64", "single-tensor-decay", "single-tensor-float64"],
)
@pytest.mark.parametrize("inline", [False, True], ids=["kernel", "inline"])
def test_flat_adam_is_torch_adam(args, dtype, inline, monkeypatch):
    """The same update as ``torch.optim.Adam``: its fused kernel (fit's default, run on the flat
    buffer through ``torch.optim.adam.adam``) within a few ulp (an element in the kernel's
    vectorised body on one layout may fall in its scalar tail on the other: ~1 ulp a step), or,
    where the caller turned the fused kernel off, its single-tensor path to the bit. A small
    CPU buffer (``INLINE_MAX``, this one) takes the fused step as the single-tensor arithmetic
    written inline: to the bit that path's."""
    from pyro_dropout.infer import flat_adam

    monkeypatch.setattr(flat_adam, "INLINE_MAX", 4096 if inline else 0)
    single = args.get("fused") is False
    kernel = {"foreach": False} if inline or single else None
    ours, ref, fused, opt = _run(args, 60, dtype, kernel=kernel)
    assert fused._flat is not None and fused._optimizer is None  # stepped flat throughout
    assert fused._flat.fused == args.get("fused", True)
    assert fused._flat._inline == (inline and not single)
    tol = {"rtol": 0, "atol": 0} if kernel else {"rtol": 1e-5, "atol": 1e-7}
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **tol)
    # and the state torch would hold, per parameter, from get_state
    state = fused.get_state()["state_dict"]
    position = {id(p): i for i, p in enumerate(fused._flat.params)}  # FusedOptim's order
    for p, q in zip(ours, ref, strict=True):
        for key, value in opt.state[q].items():
            torch.testing.assert_close(state["state"][position[id(p)]][key], value, **tol)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    saved = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
    assert {k: saved[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")} == {
        k: group[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")
    }


def test_parameters_keep_identity_and_values_but_share_one_buffer():
    pyro.clear_param_store()
    a = pyro.param("a", torch.arange(6.0).reshape(2, 3))
    b = pyro.param("b", torch.ones(4), constraint=torch.distributions.constraints.positive)
    ua, ub = a.unconstrained(), b.unconstrained()
    before = [ua.detach().clone(), ub.detach().clone()]
    ua.grad, ub.grad = torch.zeros_like(ua), torch.zeros_like(ub)
    opt = fused_adam({"lr": 0.1})
    opt([ua, ub])
    flat = opt._flat
    assert flat is not None
    store = dict(pyro.get_param_store().named_parameters())
    assert store["a"] is ua and store["b"] is ub and ua.is_leaf and ua.requires_grad
    base = flat.flat.untyped_storage().data_ptr()
    assert ua.untyped_storage().data_ptr() == ub.untyped_storage().data_ptr() == base
    for p, sl in zip(flat.params, flat.slices, strict=True):
        assert p.data_ptr() == flat.flat[sl].data_ptr()  # each on its own slice
    # a zero gradient leaves Adam's parameters where they were
    for p, v in zip((ua, ub), before, strict=True):
        torch.testing.assert_close(p.detach(), v, rtol=0, atol=0)
    torch.testing.assert_close(pyro.param("b").detach(), torch.ones(4))


@pytest.mark.parametrize(
    "event",
    ["subset", "missing-grad", "new-param", "replaced-data", "read-optimizer", "closure"],
)
def test_hand_over_to_torch_adam_keeps_the_trajectory(event):
    """Each event that the flat step cannot follow exactly hands its state to a
    ``torch.optim.Adam``; the parameters then follow torch's Adam stepped the same way."""
    extra_ours = torch.nn.Parameter(torch.full((3,), 0.5))
    extra_ref = torch.nn.Parameter(torch.full((3,), 0.5))

    def between(step, params, fused):
        if step != 7:
            return
        if event in ("subset", "missing-grad"):
            params[1].grad = None  # torch's Adam skips it; a subset leaves it out
        if event == "replaced-data":
            with torch.no_grad():
                params[0].data = params[0].detach().clone()  # no longer in the buffer
        if event == "read-optimizer" and fused is not None:
            fused.optimizer.register_step_post_hook(lambda *a: calls.append(1))

    calls = []
    ours, ref = _params(), _params()
    fused = fused_adam({"lr": 0.01})
    opt = torch.optim.Adam(ref, lr=0.01, fused=True)  # the kernel fused_adam hands over to
    for step in range(15):
        _grads(ours, step)
        _grads(ref, step)
        between(step, ours, fused)
        between(step, ref, None)
        mine = [p for p in ours if p.grad is not None] if event == "subset" else list(ours)
        if event == "new-param" and step >= 7:
            extra_ours.grad = torch.ones(3)
            extra_ref.grad = torch.ones(3)
            mine.append(extra_ours)
            if step == 7:
                opt.add_param_group({"params": [extra_ref]})
        if event == "closure" and step == 7:
            fused(mine, lambda: None)
            opt.step(lambda: None)
        else:
            fused(mine)
            opt.step()
    assert fused._flat is None and fused._optimizer is not None, "handed over"
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    if event == "new-param":
        torch.testing.assert_close(extra_ours, extra_ref, rtol=1e-6, atol=1e-7)
    if event == "read-optimizer":
        assert len(calls) == 8  # steps 7-14: the hook registered on the handed-over optimiser runs
    if event in ("subset", "missing-grad"):
        counts = [float(fused.optimizer.state[p]["step"]) for p in ours]
        assert counts == [15, 14, 15, 15, 15]


def test_state_round_trip_from_the_flat_adam():
    """get_state of the flat Adam, restored into a fresh param store and optimiser (as from a
    checkpoint), continues as torch's fused Adam that never stopped (to ~1 ulp a step: the
    flat buffer puts other elements in the kernel's vectorised body; a lost moment or step
    count is off by orders more)."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    inits = {f"p{i}": torch.randn(s) for i, s in enumerate(SHAPES)}
    ours = [pyro.param(n, v.clone()).unconstrained() for n, v in inits.items()]
    ref = [torch.nn.Parameter(v.clone()) for v in inits.values()]
    fused = fused_adam({"lr": 0.02})
    opt = torch.optim.Adam(ref, lr=0.02, fused=True)
    for step in range(10):
        _grads(ours, step)
        _grads(ref, step)
        fused(ours)
        opt.step()
    state = fused.get_state()
    assert sorted(state["param_names"]) == sorted(inits)
    values = {n: p.detach().clone() for n, p in zip(inits, ours, strict=True)}
    pyro.clear_param_store()
    copies = [pyro.param(n, values[n]).unconstrained() for n in inits]
    again = fused_adam({"lr": 0.02})
    again.set_state(state)
    for step in range(10, 20):
        _grads(copies, step)
        _grads(ref, step)
        again(copies)
        opt.step()
    assert again._flat is not None and again._pending_state is None
    for a, b in zip(copies, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    # the same state loads into torch's own Adam
    plain = [torch.nn.Parameter(values[n].clone()) for n in state["param_names"]]
    torch_opt = torch.optim.Adam(plain, lr=0.02)
    torch_opt.load_state_dict(state["state_dict"])
    assert float(torch_opt.state[plain[0]]["step"]) == 10
    pyro.clear_param_store()


def test_saved_state_with_unequal_counts_hands_over():
    """A saved state whose parameters took different numbers of steps cannot be one flat
    count: the restored optimiser is torch's, with each count kept."""
    pyro.clear_param_store()
    a = pyro.param("a", torch.ones(3)).unconstrained()
    b = pyro.param("b", torch.ones(2)).unconstrained()
    first = FusedOptim(torch.optim.Adam, {"lr": 0.1, "foreach": False})
    for step in range(4):
        a.grad, b.grad = torch.ones(3), torch.ones(2)
        first([a, b] if step % 2 else [a])
    state = first.get_state()
    again = fused_adam({"lr": 0.1})
    again.set_state(state)
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    again([a, b])
    assert again._flat is None
    steps = again.optimizer.state
    assert (float(steps[a]["step"]), float(steps[b]["step"])) == (5, 3)
    pyro.clear_param_store()


def test_only_plain_adam_on_one_device_and_dtype_steps_flat():
    assert flat_adam_args(torch.optim.Adam, {"lr": 0.1, "fused": True}) is not None
    assert flat_adam_args(torch.optim.Adam, {"lr": 0.1, "amsgrad": False}) is not None
    assert flat_adam_args(torch.optim.Adam, {"lr": 0.1, "amsgrad": True}) is None
    assert flat_adam_args(torch.optim.Adam, {"lr": 0.1, "maximize": True}) is None
    assert flat_adam_args(torch.optim.Adam, {"lr": torch.tensor(0.1)}) is None
    assert flat_adam_args(torch.optim.AdamW, {"lr": 0.1}) is None
    assert flat_adam_args(torch.optim.SGD, {"lr": 0.1}) is None
    mixed = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2).double())]
    for p in mixed:
        p.grad = torch.ones_like(p)
    opt = fused_adam({"lr": 0.1})
    opt(mixed)
    assert opt._flat is None and opt._optimizer is not None
    detached = [torch.ones(3).detach().requires_grad_()]  # cannot be re-homed
    detached[0].grad = torch.ones(3)
    base = torch.ones(3)
    view_of_data = base.data.requires_grad_()
    view_of_data.grad = torch.ones(3)
    for params in (detached, [view_of_data]):
        opt = fused_adam({"lr": 0.1})
        opt(params)  # either flat or torch's Adam, never an error
        assert (params[0].detach() < 1).all()


def test_flat_buffer_rejects_what_it_cannot_hold():
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    flat = FlatAdam([p], {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})
    assert flat.ready()
    p.grad = torch.full((2,), 3.0)  # another tensor (as Pyro's zero_grads leaves): copied in
    assert flat.ready() and p.grad.data_ptr() == flat.flat_grad.data_ptr()
    assert torch.equal(flat.flat_grad, torch.full((2,), 3.0))
    p.grad = None
    assert not flat.ready()


def test_fit_path_steps_flat_and_matches_pyros_adam():
    """CompiledSVI with fused_adam (fit's default) steps the flat Adam after its traced steps,
    and trains to the same parameters as Pyro's per-parameter Adam on the same draws."""
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    y = x[:, :1] - x[:, 2:]
    results = []
    for optim in (fused_adam({"lr": 0.01}), pyro.optim.Adam({"lr": 0.01})):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
        guide = AutoDropout(model, dropout_rate=0.1)
        svi_cls = CompiledSVI if isinstance(optim, FusedOptim) else SVI
        svi = svi_cls(model, guide, optim, JitMeanFieldELBO())
        with local_reparameterization():
            for _ in range(30):
                svi.step(x, y)
        if isinstance(optim, FusedOptim):
            assert optim._flat is not None and optim._optimizer is None
        results.append({k: v.detach().clone() for k, v in guide.named_parameters()})
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-5, atol=1e-6, msg=k)
    pyro.clear_param_store()


def test_default_fit_builds_no_torch_optimiser():
    """Time to first step: a default ``fit`` steps the flat Adam and never builds a
    ``torch.optim`` optimiser, whose first construction in a process imports
    ``torch._dynamo`` (seconds on a slow host). Checked in a fresh process."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from pyro_dropout import AutoDropout, BayesianMLP, fit\n"
        "x = torch.randn(64, 3); y = x[:, :1]\n"
        "model = BayesianMLP(3, 1, hidden=(8,))\n"
        "fit(model, AutoDropout(model), x, y, num_steps=8, batch_size=16, progress=False)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr


def test_no_fused_kernel_for_the_buffer_runs_the_single_tensor_update(monkeypatch):
    """Where torch's fused kernel refuses the buffer at the first step (a device or dtype it
    lacks), the flat Adam runs torch's single-tensor update, to the bit."""
    from pyro_dropout.infer import flat_adam

    real = flat_adam.adam
    refused = []

    def no_fused_kernel(*args, fused=None, **kwargs):
        if fused:
            refused.append(1)
            raise RuntimeError("no fused kernel here")
        return real(*args, fused=fused, **kwargs)

    monkeypatch.setattr(flat_adam, "adam", no_fused_kernel)
    monkeypatch.setattr(flat_adam, "INLINE_MAX", 0)  # (a small CPU buffer never calls adam)
    ours, ref, opt, _ = _run({"lr": 0.01}, 20, kernel={"foreach": False})
    assert opt._flat is not None and opt._flat.fused is False and refused == [1]
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

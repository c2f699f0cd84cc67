"""``FusedOptim``: Pyro's per-parameter update with one torch optimiser, Pyro's step
semantics (only the step's parameters move), state round trip and argument errors."""

import inspect

import pyro
import pytest
import torch
from pyro.infer import SVI

from pyro_dropout import AutoMeanField, BayesianMLP, local_reparameterization
from pyro_dropout.infer import FusedOptim, MeanFieldELBO, fused_adam


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 3, generator=g)
    return x, x[:, 0] - x[:, 2]


def _train(optim, steps, state=None):
    """``steps`` SVI steps from a fixed start; returns the final parameters and the optimiser."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    guide = AutoMeanField(model, init_scale=0.1)
    svi = SVI(model, guide, optim, MeanFieldELBO(max_plate_nesting=1))
    with local_reparameterization():
        for _ in range(steps):
            svi.step(x, y)
    return {k: v.detach().clone() for k, v in guide.named_parameters()}, optim


@pytest.mark.parametrize(
    "fused, reference",
    [
        (lambda: fused_adam({"lr": 0.01}), lambda: pyro.optim.Adam({"lr": 0.01})),
        (
            lambda: FusedOptim(torch.optim.SGD, {"lr": 0.001, "momentum": 0.9}),
            lambda: pyro.optim.SGD({"lr": 0.001, "momentum": 0.9}),
        ),
        (
            lambda: FusedOptim(torch.optim.Adam, {"lr": 0.01}, {"clip_norm": 1.0}),
            lambda: pyro.optim.Adam({"lr": 0.01}, {"clip_norm": 1.0}),
        ),
    ],
    ids=["adam", "sgd-momentum", "adam-clip-norm"],
)
def test_same_trajectory_as_pyro_per_parameter_optimisers(fused, reference):
    a, _ = _train(fused(), 25)
    b, _ = _train(reference(), 25)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_only_the_steps_parameters_move():
    a = pyro.param("a", torch.ones(3))
    b = pyro.param("b", torch.ones(2))
    opt = fused_adam({"lr": 0.1})
    for p in (a, b):
        p.unconstrained().grad = torch.ones_like(p)
    opt([a.unconstrained(), b.unconstrained()])
    b_before = b.detach().clone()
    state_before = {k: v.clone() for k, v in opt.optimizer.state[b.unconstrained()].items()}
    a.unconstrained().grad = torch.ones(3)
    b.unconstrained().grad = torch.full((2,), 5.0)  # a stale gradient: must not be used
    opt([a.unconstrained()])
    assert torch.equal(b.detach(), b_before)
    for k, v in opt.optimizer.state[b.unconstrained()].items():
        assert torch.equal(v, state_before[k]), k
    assert torch.equal(b.unconstrained().grad, torch.full((2,), 5.0))  # restored
    assert (a.detach() < b_before[0]).all()


def test_state_round_trip_continues_the_same_trajectory():
    straight, _ = _train(fused_adam({"lr": 0.01}), 20)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    guide = AutoMeanField(model, init_scale=0.1)
    first = fused_adam({"lr": 0.01})
    svi = SVI(model, guide, first, MeanFieldELBO(max_plate_nesting=1))
    with local_reparameterization():
        for _ in range(10):
            svi.step(x, y)
        state = first.get_state()
        assert len(state["param_names"]) == len(straight)
        svi.optim = fused_adam({"lr": 0.01})  # a fresh optimiser, restored on its first step
        svi.optim.set_state(state)
        for _ in range(10):
            svi.step(x, y)
    assert svi.optim._pending_state is None
    for k, v in guide.named_parameters():
        torch.testing.assert_close(v.detach(), straight[k], rtol=1e-5, atol=1e-6, msg=k)


def test_argument_errors():
    with pytest.raises(TypeError, match="one dict of optimiser arguments"):
        FusedOptim(torch.optim.Adam, lambda name: {"lr": 0.1})
    with pytest.raises(TypeError, match="clip_args as a dict"):
        FusedOptim(torch.optim.Adam, {"lr": 0.1}, lambda m, p: {})


def test_fastest_update_is_chosen_unless_the_caller_sets_one():
    assert fused_adam({"lr": 0.1}).pt_optim_args["fused"] is True
    assert "foreach" not in fused_adam({"lr": 0.1}).pt_optim_args
    own = FusedOptim(torch.optim.Adam, {"lr": 0.1, "foreach": False}).pt_optim_args
    assert own == {"lr": 0.1, "foreach": False}
    assert "foreach" not in FusedOptim(torch.optim.LBFGS, {"lr": 0.1}).pt_optim_args
    assert FusedOptim(torch.optim.Adagrad, {"lr": 0.1}).pt_optim_args.get("fused") in (None, True)


def test_falls_back_to_foreach_where_fused_is_unsupported():
    opt = fused_adam({"lr": 0.1})
    p = pyro.param("p", torch.ones(3, dtype=torch.float64))
    q = pyro.param("q", torch.ones(2))
    u = p.unconstrained()
    u.grad = torch.ones_like(u)
    original = opt.pt_optim_constructor

    def picky(params, **kwargs):  # stands in for a device the fused kernel lacks
        if kwargs.get("fused"):
            raise RuntimeError("fused not supported here")
        return original(params, **kwargs)

    opt.pt_optim_constructor = picky
    opt([u, q.unconstrained()])
    assert opt.pt_optim_args.get("foreach") is True and "fused" not in opt.pt_optim_args
    assert (p.detach() < 1).all()


def test_step_hooks_run_every_step():
    p = torch.nn.Parameter(torch.ones(2))
    calls = []
    fused = FusedOptim(torch.optim.Adam, {"lr": 0.1})
    for _ in range(3):
        p.grad = torch.ones(2)
        fused([p])
        if fused.optimizer is not None and not calls:
            fused.optimizer.register_step_pre_hook(lambda *a: calls.append(2))
    assert calls == [2, 2]


_ADAM_ARGS = set(inspect.signature(torch.optim.Adam).parameters)


def _grads(params, step):
    for p in params:
        p.grad = torch.sin(p.detach() * (step + 1)) + 0.1


def _fused_vs_adam(args, steps, dtype=torch.float32, schedule=None, between=None):
    """Parameters and optimiser state after ``steps`` steps of ``FusedOptim`` and of
    ``torch.optim.Adam(fused=True)`` itself."""
    if "decoupled_weight_decay" in args and "decoupled_weight_decay" not in _ADAM_ARGS:
        pytest.skip("this torch's Adam has no decoupled_weight_decay")
    results = []
    for ours in (True, False):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(5, 3, dtype=dtype)) for _ in range(3)]
        params.append(torch.nn.Parameter(torch.randn(3, dtype=dtype)))
        if ours:
            fused = FusedOptim(torch.optim.Adam, dict(args))
            fused(params)  # creates the optimiser (first step below replaces this one's grads)
        # the reference: torch's Adam with the flags FusedOptim chose (fused=True, or foreach
        # where this torch has no fused kernel for the CPU: before torch 2.4)
        opt = fused.optimizer if ours else torch.optim.Adam(params, **fused.pt_optim_args)
        sched = schedule(opt) if schedule else None
        for step in range(steps):
            _grads(params, step)
            if between is not None:
                between(step, params, opt)
            fused(params) if ours else opt.step()
            if sched is not None:
                sched.step()
        # state by parameter (FusedOptim orders its parameters by name, not as passed)
        results.append((params, [opt.state[p] for p in params], fused if ours else None))
    return results


def _assert_same(results):
    (p1, s1, _), (p0, s0, _) = results
    for a, b in zip(p1, p0, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for i, (a, b) in enumerate(zip(s1, s0, strict=True)):
        assert a.keys() == b.keys()
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=f"{i} {k}")


@pytest.mark.parametrize(
    "args, dtype",
    [
        ({"lr": 0.01}, torch.float32),
        ({"lr": 0.01, "weight_decay": 0.1, "maximize": True, "eps": 1e-6}, torch.float32),
        ({"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, torch.float32),
        ({"lr": 0.003, "betas": (0.8, 0.95)}, torch.float64),
    ],
    ids=["adam", "decay-maximize", "adamw", "float64"],
)
def test_fused_optim_is_fused_adam_bit_for_bit(args, dtype):
    """The same parameters and state as ``Adam(fused=True).step()``."""
    results = _fused_vs_adam(args, 30, dtype)
    _assert_same(results)
    fused = results[0][2]
    state = fused.optimizer.state
    steps = [state[p]["step"] for p in fused.optimizer.param_groups[0]["params"]]
    assert len({id(s) for s in steps}) == len(steps)  # one counter per parameter
    assert all(float(s) == 30 for s in steps)


def test_fused_optim_follows_a_learning_rate_schedule():
    _assert_same(
        _fused_vs_adam({"lr": 0.05}, 30, schedule=lambda o: torch.optim.lr_scheduler.StepLR(o, 7))
    )


def test_fused_optim_steps_nothing_for_a_parameter_without_gradient():
    """A step where one parameter has no gradient: Adam skips it (its counter stays), and the
    later steps agree again."""

    def drop_one(step, params, opt):
        if step in (10, 11, 20):
            params[1].grad = None

    results = _fused_vs_adam({"lr": 0.01}, 30, between=drop_one)
    _assert_same(results)
    fused = results[0][2]
    counters = [float(fused.optimizer.state[p]["step"]) for p in results[0][0]]
    assert counters == [30, 27, 30, 30]


def test_fused_optim_survives_a_state_round_trip_and_hooks():
    """``load_state_dict`` mid-run (new state objects) and a step hook: the same trajectory as
    torch's Adam, and the hook runs every step."""
    calls = []

    def reload_and_hook(step, params, opt):
        if step == 12:
            opt.load_state_dict(opt.state_dict())
        if step == 18:
            opt.register_step_post_hook(lambda *a: calls.append(1))

    results = _fused_vs_adam({"lr": 0.01}, 30, between=reload_and_hook)
    _assert_same(results)
    assert len(calls) == 2 * 12  # both runs, steps 18-29


def test_fused_optim_keeps_pyros_only_the_steps_parameters_move():
    """After steady steps of two parameters, a step of one: the other keeps its value and
    counter, then both step again."""
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(2))
    fused = fused_adam({"lr": 0.1})
    for _ in range(3):
        a.grad, b.grad = torch.ones(3), torch.ones(2)
        fused([a, b])
    before = b.detach().clone()
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    fused([a])
    torch.testing.assert_close(b.detach(), before, rtol=0, atol=0)
    state = fused.optimizer.state
    assert (float(state[a]["step"]), float(state[b]["step"])) == (4, 3)
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    fused([b, a])
    assert (float(state[a]["step"]), float(state[b]["step"])) == (5, 4)

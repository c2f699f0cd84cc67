"""``graph_passes.simplify``: a traced loss graph with fewer ops and the same values for the
same random stream; random draws are never folded or merged; ops that change a value, shape,
stride or dtype are kept."""

import pyro
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    local_reparameterization,
)
from pyro_dropout.guides import AutoConcreteDropout
from pyro_dropout.infer import JitMeanFieldELBO, graph_passes, traced


def _trace(fn, *inputs, simplify=True, monkeypatch=None):
    if not simplify:
        monkeypatch.setattr(graph_passes, "simplify", lambda g: (None, None))
    try:
        return traced._OwnedTrace(fn, inputs)
    finally:
        if not simplify:
            monkeypatch.undo()


def _kinds(graph):
    return [n.kind() for n in graph.nodes() if n.kind().startswith("aten::")]


def test_random_draws_are_neither_folded_nor_merged():
    def fn(x):
        return x + torch.randn(3) + torch.randn(3) + torch.rand(3) * 0

    t = _trace(fn, torch.zeros(3))
    assert _kinds(t.graph).count("aten::randn") == 2
    torch.manual_seed(0)
    out = t(torch.zeros(3))
    torch.manual_seed(0)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(out, a + b)


def test_identities_are_dropped_and_real_ops_kept():
    w = torch.randn(4, 3)

    def fn(x):
        y = x.expand(4, 3).reshape(4, 3).to(torch.float32) + 0.0  # identities
        y = y * 1.0 / 1.0
        z = x.expand(2, 4, 3)  # a real broadcast
        v = x.to(torch.float64)  # a real cast
        c = x.to(torch.float32, copy=True)  # a copy asked for
        s = (y * w).sum().sum()  # the second sum is of a scalar
        return s + z.sum() + v.sum().float() + c.sum() + (x + 1.0).sum()

    x = torch.randn(4, 3)
    t = _trace(fn, x)
    kinds = _kinds(t.graph)
    assert "aten::reshape" not in kinds
    assert kinds.count("aten::expand") == 1  # the real one
    assert kinds.count("aten::to") == 3  # the casts to float64 and back, and the copy
    assert kinds.count("aten::add") == 5  # four of the return's adds and x + 1
    assert "aten::div" not in kinds
    torch.testing.assert_close(t(x), fn(x))


def test_broadcast_of_one_shape_exposes_constants():
    scale = torch.tensor(2.0)

    def fn(loc):
        loc, s = torch.broadcast_tensors(loc, scale.expand(3))
        return (loc / s.log()).sum()

    loc = torch.randn(3)
    t = _trace(fn, loc)
    kinds = _kinds(t.graph)
    assert "aten::log" not in kinds  # the constant's log is folded
    torch.testing.assert_close(t(loc), fn(loc))


GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "concrete": AutoConcreteDropout,
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.1),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-2.0),
}


@pytest.mark.parametrize("guide", list(GUIDES))
def test_loss_graph_same_values_fewer_ops(guide, monkeypatch):
    """The compiled loss of a BNN, simplified or not, gives the same loss and gradients for
    the same seed (bit for bit: the same ops on the same draws), with under half the ops."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=g)
    y = torch.randn(32, generator=g)
    results = {}
    for simplify in (True, False):
        pyro.clear_param_store()
        pyro.set_rng_seed(1)
        model = BayesianMLP(8, 1, hidden=(50,), tau=10.0)
        q = GUIDES[guide](model)
        elbo = JitMeanFieldELBO(max_plate_nesting=1)
        if not simplify:
            monkeypatch.setattr(graph_passes, "simplify", lambda g: (None, None))
        with local_reparameterization():
            for _ in range(3):  # trace, trace again and check, then run the graph
                pyro.set_rng_seed(2)
                loss = elbo.differentiable_loss(model, q, x, y, num_data=1000)
        monkeypatch.undo()
        params = sorted(pyro.get_param_store().items())
        grads = torch.autograd.grad(loss, [p.unconstrained() for _, p in params])
        (graph,) = next(iter(elbo._compiled.values()))[0].compiled.values()
        results[simplify] = loss, grads, len(_kinds(graph.graph))
    (l1, g1, n1), (l0, g0, n0) = results[True], results[False]
    assert n1 < n0 / 2, (n1, n0)
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_softplus_gradient_of_a_tiny_scale_is_kept():
    """A broadcast of a computed scale stays: without it TorchScript's symbolic gradient of
    ``softplus`` (``1 - exp(-y)`` in float32) was 0.954 instead of 1.000 at y = 1e-6."""

    def fn(loc, u):
        loc, scale = torch.broadcast_tensors(loc, torch.nn.functional.softplus(u))
        return (loc - scale.log()).sum()

    u = torch.full((8, 3), -13.8155, requires_grad=True)
    loc = torch.zeros(8, 3, requires_grad=True)
    t = _trace(fn, loc, u)
    for _ in range(3):  # the optimising executor differentiates from the second run on
        (grad,) = torch.autograd.grad(t(loc, u), [u])
    torch.testing.assert_close(grad, torch.full_like(grad, -1.0), rtol=1e-5, atol=1e-5)


def test_constant_broadcast_to_another_shape_is_a_constant():
    """A fixed noise scale broadcast against a computed mean (``Normal(f, 0.3)``): its
    ``log`` and square fold, and the values are unchanged."""
    scale = torch.tensor(0.3)

    def fn(f, y):
        loc, s = torch.broadcast_tensors(f, scale)
        return (-((y - loc) ** 2) / (2 * s**2) - s.log()).sum()

    f, y = torch.randn(5, 1), torch.randn(5, 1)
    t = _trace(fn, f, y)
    kinds = _kinds(t.graph)
    assert "aten::log" not in kinds and kinds.count("aten::pow") == 1
    torch.testing.assert_close(t(f, y), fn(f, y))


def test_bias_added_after_a_linear_moves_into_it():
    def fn(x, w, b, b2):
        return (torch.nn.functional.linear(x, w) + b).sum() + (
            torch.nn.functional.linear(x, w) + b2  # a bias per row: kept apart
        ).sum()

    x, w = torch.randn(4, 3), torch.randn(5, 3, requires_grad=True)
    b, b2 = torch.randn(5, requires_grad=True), torch.randn(4, 5)
    t = _trace(fn, x, w, b, b2)
    kinds = _kinds(t.graph)
    assert kinds.count("aten::linear") == 2 and kinds.count("aten::add") == 2, kinds
    out, ref = t(x, w, b, b2), fn(x, w, b, b2)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out, [w, b]), torch.autograd.grad(ref, [w, b])
    for a, r in zip(*grads, strict=True):
        torch.testing.assert_close(a, r)


def test_a_clamp_of_a_clamp_becomes_one_clamp_with_the_same_gradient():
    def fn(x, y):
        inner = x.clamp(-1.0, 2.0)  # used once: merged into the next
        shared = y.clamp(min=0.0)  # used twice: kept
        return (inner.clamp(0.5, 3.0) * 3).sum() + shared.clamp(max=1.0).sum() + shared.sum()

    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 2.5], requires_grad=True)
    y = torch.tensor([-1.0, 0.3, 1.5], requires_grad=True)
    t = _trace(fn, x, y)
    assert _kinds(t.graph).count("aten::clamp") == 3  # (the kept pair and the merged one)
    bounds = {
        tuple(graph_passes._clamp_bound(n.inputsAt(i))[1] for i in (1, 2))
        for n in t.graph.nodes()
        if n.kind() == "aten::clamp" and n.inputsAt(0).node().kind() == "prim::Param"
    }
    assert bounds == {(0.5, 2.0), (0.0, None)}, bounds
    out, ref = t(x, y), fn(x, y)
    torch.testing.assert_close(out, ref)
    for a, r in zip(
        torch.autograd.grad(out, [x, y]), torch.autograd.grad(ref, [x, y]), strict=True
    ):
        torch.testing.assert_close(a, r)


def test_a_bias_computed_after_its_linear_moves_before_it_unless_it_draws():
    """The variance of a bias (its scale squared, computed after the weight's product) is moved
    before the ``linear`` and fused; a random draw is never moved (the stream's order)."""

    def fn(x, w, s):
        var = torch.nn.functional.linear(x * x, w * w)
        var = var + s * s  # computed after the linear in the trace
        noisy = torch.nn.functional.linear(x, w) + torch.randn(5)
        return var.sum() + noisy.sum()

    x, w = torch.randn(4, 3), torch.randn(5, 3, requires_grad=True)
    s = torch.rand(5, requires_grad=True)
    t = _trace(fn, x, w, s)
    kinds = _kinds(t.graph)
    assert kinds.count("aten::linear") == 2 and kinds.count("aten::add") == 2, kinds
    torch.manual_seed(0)
    out = t(x, w, s)
    torch.manual_seed(0)
    ref = fn(x, w, s)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out, [w, s]), torch.autograd.grad(ref, [w, s])
    for a, r in zip(*grads, strict=True):
        torch.testing.assert_close(a, r)


def test_a_bias_is_not_moved_across_an_in_place_write():
    """Between the linear and the bias's computation an in-place op writes to the tensor the
    bias reads: moving the bias earlier would read the old value, so it stays (and the result
    is the traced function's). The written tensor is a copy (``s * 1.0``), which is not
    dropped as an identity."""

    def fn(x, w, s):
        t = s * 1.0
        out = torch.nn.functional.linear(x, w)
        t.mul_(3.0)  # written after the linear, read by the bias below
        return (out + t * t).sum()

    x, w = torch.randn(4, 3), torch.randn(5, 3, requires_grad=True)
    s = torch.rand(5, requires_grad=True)
    t = _trace(fn, x, w, s)
    out, ref = t(x, w, s), fn(x, w, s)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out, [w, s]), torch.autograd.grad(ref, [w, s])
    for a, r in zip(*grads, strict=True):
        torch.testing.assert_close(a, r)
    # ``s * 1.0`` is a copy that the write must not reach s through (dropping it as an
    # identity would write to the caller's tensor)
    data = torch.rand(5)
    before = data.clone()
    torch.testing.assert_close(t(x, w, data), fn(x, w, before.clone()))
    assert torch.equal(data, before)


# -- linear folding -------------------------------------------------------------------------


def _fold_disabled(monkeypatch):
    monkeypatch.setattr(graph_passes, "_fold_linear", lambda graph: 0)


def _value_and_grads(t, inputs, grad_inputs):
    out = t(*inputs)
    grads = torch.autograd.grad(out.sum(), grad_inputs, allow_unused=True)
    return out, [
        torch.zeros_like(x) if d is None else d for x, d in zip(grad_inputs, grads, strict=True)
    ]


def test_a_likelihood_and_kl_fold_into_one_linear_combination(monkeypatch):
    """A Gaussian log-likelihood (``-(y - f)² / 2σ² - log σ - log √2π``, summed over an event
    dim of one, scaled by N / B, summed) and closed-form KL terms added to it: one linear
    combination of the products and logs it reads, with fewer ops; the same value and
    gradients."""
    sigma, scale = torch.tensor(0.3), 1000 / 32

    def fn(f, y, m, s):
        value = -((y.unsqueeze(-1) - f) ** 2) / (2 * sigma**2) - sigma.log() - 0.9189385
        log_lik = (value.sum(-1) * scale).sum()
        kl_m = (0.5 * (s * s + m * m) - s.log() - 0.5).sum()
        kl_b = (m.pow(2).sum(0, keepdim=True) * 0.45 + 0.1).sum()
        return kl_m + kl_b - log_lik

    g = torch.Generator().manual_seed(0)
    f = torch.randn(32, 1, generator=g, requires_grad=True)
    y = torch.randn(32, generator=g)
    m = torch.randn(50, 8, generator=g, requires_grad=True)
    s = torch.rand(50, 8, generator=g).add(0.1).requires_grad_()
    folded = _trace(fn, f, y, m, s)
    _fold_disabled(monkeypatch)
    unfolded = _trace(fn, f, y, m, s)
    n1, n0 = len(_kinds(folded.graph)), len(_kinds(unfolded.graph))
    assert n1 <= n0 - 8, (n1, n0)
    out, grads = _value_and_grads(folded, (f, y, m, s), (f, m, s))
    ref, ref_grads = _value_and_grads(unfolded, (f, y, m, s), (f, m, s))
    torch.testing.assert_close(out, fn(f, y, m, s), rtol=1e-6, atol=0)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_folding_leaves_what_it_cannot_express():
    """Kept as traced: a value written in place after the tree read it, a constant that
    broadcasts the result to a larger shape, a one-element float64 constant that promotes
    the result's dtype, integer arithmetic."""

    def fn(x, k):
        a = x * 2.0
        b = a + 1.0
        x2 = x * 1.5
        c = x2 - 3.0
        x2.mul_(2.0)  # after c read x2
        wide = (x * 2.0 + torch.ones(1, 1)) * 3.0  # (1, 5)
        wide64 = (x * 2.0) * torch.ones(1, dtype=torch.float64) + 1.0  # float64
        ints = (k * 2 + 1).sum()
        return b.sum() + c.sum() + x2.sum(), wide, wide64, ints

    x, k = torch.randn(5), torch.arange(4)
    t = _trace(fn, x, k)
    out, ref = t(x, k), fn(x, k)
    for a, r in zip(out, ref, strict=True):
        assert a.shape == r.shape and a.dtype == r.dtype
        torch.testing.assert_close(a, r)


_LINEAR_OPS = ("add", "sub", "rsub", "mul", "div", "neg", "sum", "sum_dim", "sum_one", "item")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_folded_graphs_equal_their_functions(data):
    """Random trees of linear ops (constants as numbers, 0-dim and expanded tensors; sums over
    all, some and one-element dims; reshapes of one element) over non-linear leaves of
    broadcasting shapes: the simplified graph gives the function's value and gradients."""
    shapes = data.draw(
        mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4)
    ).input_shapes
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    leaves = [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]
    program = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(_LINEAR_OPS),
                st.integers(0, 100),
                st.integers(0, 100),
                st.sampled_from([0.5, -2.0, 1.0, 3.0]),
                st.sampled_from(["number", "tensor0", "expanded"]),
            ),
            min_size=1,
            max_size=12,
        )
    )

    made = {}  # constants made on the eager call, captured (as constants) by the trace

    def const(c, how, like, step):
        if how == "number":
            return c
        if step not in made:
            shape = () if how == "tensor0" else like.shape  # expanded: folded as its one value
            made[step] = torch.full(shape, c, dtype=like.dtype)
        return made[step]

    def fn(*xs):
        pool = [x.exp() if i % 2 else x * x for i, x in enumerate(xs)]  # non-linear leaves
        for step, (op, i, j, c, how) in enumerate(program):
            a, b = pool[i % len(pool)], pool[j % len(pool)]
            if op in ("add", "sub", "rsub"):
                other = b if i % 3 else const(c, how, a, step)
                alpha = 1 if j % 2 else c
                out = getattr(torch, op)(a, other, alpha=alpha)
            elif op == "mul":
                out = a * const(c, how, a, step)
            elif op == "div":
                out = a / const(c, how, a, step)
            elif op == "neg":
                out = -a
            elif op == "sum":
                out = a.sum()
            elif op == "sum_dim":
                out = a.sum(0) if a.dim() else a
            elif op == "sum_one":  # a sum to one element, kept as (1, 1, ...)
                out = a.sum(dim=tuple(range(a.dim())), keepdim=True) if a.dim() else a
            else:  # a one-element reshape
                out = a.sum().reshape(1, 1).squeeze(0)
            pool.append(out)
        return pool[-1] * 1.0 + pool[-2 if len(pool) > 1 else -1].sum()

    ref, ref_grads = _value_and_grads(fn, leaves, leaves)
    t = _trace(fn, *leaves)
    out, grads = _value_and_grads(t, leaves, leaves)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_folding_keeps_a_nan_that_the_ops_would_give():
    """``2x - 2x`` and ``x * 0`` are NaN where x is NaN: folding must not cancel the term."""

    def fn(x, y):
        a = (x * 2.0 - x * 2.0 + y).sum()
        b = (x * 0.0 + y * 3.0).sum()
        return a, b

    x, y = torch.randn(5), torch.randn(5)
    t = _trace(fn, x, y)
    x[2] = float("nan")
    for out, ref in zip(t(x, y), fn(x, y), strict=True):
        assert torch.isnan(out) and torch.isnan(ref)
    x[2] = 1.0
    for out, ref in zip(t(x, y), fn(x, y), strict=True):
        torch.testing.assert_close(out, ref)

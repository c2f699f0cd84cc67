"""The loss capture (:mod:`pyro_dropout.infer.capture`): a replay computes what the function
computes, draws fresh numbers, folds what is constant and nothing else, and refuses what it
cannot replay."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pyro_dropout.infer.capture import CaptureError, capture

from ._functions import Square


def _grads(fn, inputs):
    w = [t for t in inputs if t.requires_grad]
    return torch.autograd.grad(fn(*inputs), w)


def test_a_deterministic_function_replays_exactly_with_its_gradients():
    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 3)
    prior = torch.full((4, 3), 2.0)

    def fn(w, x):
        kl = ((w - torch.zeros(4, 3)) / prior) ** 2 * 0.5 + torch.log(prior)  # constants
        h = torch.relu(x @ w.T).expand(5, 4).reshape(5, 4)  # identity reshapes
        return (h.sum(-1) ** 2).sum() + kl.sum() * 1.0 + 0.0

    out, c = capture(fn, (w, x))
    torch.testing.assert_close(c(w, x), fn(w, x))
    for a, b in zip(_grads(c, (w, x)), _grads(fn, (w, x)), strict=True):
        torch.testing.assert_close(a, b)
    x2 = torch.randn(5, 3)  # new data: the graph reads its input
    torch.testing.assert_close(c(w, x2), fn(w, x2))
    names = [str(n.target) for n in c.graph.nodes if n.op == "call_function"]
    assert not any("log" in n or "zeros" in n or "full" in n for n in names), names  # folded
    assert not any("expand" in n or "reshape" in n for n in names), names  # identities
    # (a * 0.5 + log(prior)).sum(): the sum of the leaf, scaled, plus a number
    assert c.ops <= 12 and "sub" not in c.module.code, c.module.code  # w - 0: w


def test_draws_are_replayed_not_frozen_and_the_random_stream_is_shared():
    w = torch.ones(3, requires_grad=True)

    def fn(w):
        return (w * torch.randn(3)).sum() + torch.rand(()) * 0.0

    torch.manual_seed(1)
    _, c = capture(fn, (w,))
    a, b = c(w), c(w)
    assert a.item() != b.item()  # a fresh draw per call
    torch.manual_seed(2)
    expected = (w * torch.randn(3)).sum()  # the unused draw is dropped: one randn per call
    torch.manual_seed(2)
    torch.testing.assert_close(c(w), expected)


def test_an_unknown_sampler_is_never_folded():
    """A draw is found by the random generator's state, not by a list of names."""
    w = torch.ones(3, requires_grad=True)

    def fn(w):
        noise = torch.empty(3).exponential_()  # no input: would fold if taken as a constant
        return (w * noise).sum()

    _, c = capture(fn, (w,))
    assert c(w).item() != c(w).item()


def test_a_constant_made_from_data_outside_torch_differs_between_captures():
    """A value taken through NumPy is a constant of the graph: the text of two captures on
    different data differs, which is what the compiled ELBO's two-capture check compares."""
    w = torch.ones(3, requires_grad=True)

    def fn(w, x):
        scale = torch.from_numpy(np.asarray(x.detach().numpy().std(), dtype=np.float32))
        return (w * x / scale).sum()

    _, a = capture(fn, (w, torch.arange(3.0)))
    _, b = capture(fn, (w, torch.arange(3.0) ** 2))
    _, again = capture(fn, (w, torch.arange(3.0)))
    assert a.text != b.text and a.text == again.text


def test_an_operation_outside_the_python_api_is_refused():
    w = torch.ones(3, requires_grad=True)
    with pytest.raises(CaptureError, match="does not reproduce the recorded call"):
        capture(lambda w: Square.apply(w).sum(), (w,))


def test_a_function_returning_no_tensor_is_refused():
    with pytest.raises(CaptureError, match="not tensors"):
        capture(lambda w: float(w.sum()), (torch.ones(2),))


def test_no_grad_parts_stay_without_gradient():
    w = torch.ones(3, requires_grad=True)

    def fn(w):
        with torch.no_grad():
            mask = (w * 2 > 1).float()
        return (w * mask).sum()

    _, c = capture(fn, (w,))
    (g,) = torch.autograd.grad(c(w), (w,))
    torch.testing.assert_close(g, torch.ones(3))


def test_buffers_filled_in_place_stay_distinct():
    """Two ``torch.empty`` calls of one shape, each filled with a draw and saved for the
    backward pass: merging the identical calls would make the second draw overwrite the first
    (an LSTM's per-gate bias draws in the model zoo did)."""
    w = torch.ones(4, requires_grad=True)

    def fn(w):
        a = torch.empty(4).normal_()
        b = torch.empty(4).normal_()
        return (w * a).sum() * (w * b).sum()

    _, c = capture(fn, (w,))
    (g,) = torch.autograd.grad(c(w), (w,))
    assert torch.isfinite(g).all()


def test_a_clamp_of_a_clamp_replays_with_the_same_values_and_gradients():
    x = torch.linspace(-2.0, 2.0, 41, requires_grad=True)

    def fn(x):
        return (torch.clamp(x, min=-1.5, max=1.0).clamp(-0.5, 1.2) * x).sum()

    _, c = capture(fn, (x,))
    torch.testing.assert_close(c(x), fn(x))
    for a, b in zip(_grads(c, (x,)), _grads(fn, (x,)), strict=True):
        torch.testing.assert_close(a, b)


def test_a_product_and_a_bias_computed_after_it_are_one_linear():
    """``F.linear(x, w) + b`` is one ``F.linear(x, w, b)`` also where ``b`` is computed after
    the product (a Gaussian family's bias variance) or is 0-d (a one-unit layer's), with the
    same values and gradients."""
    torch.manual_seed(0)
    inputs = (
        torch.randn(6, 3),
        torch.randn(2, 3, requires_grad=True),
        torch.randn(2, requires_grad=True),
        torch.randn(1, 3, requires_grad=True),
        torch.randn((), requires_grad=True),
    )

    def fn(x, w, s, w1, t):
        a = F.linear(x * x, w)
        b = F.softplus(s) ** 2  # after the product
        c = F.linear(x, w1) + t.exp()  # a 0-d bias
        return (a + b).tanh().sum() + (c * c).sum()

    _, c = capture(fn, inputs)
    linears = [n for n in c.graph.nodes if n.target is F.linear]
    assert len(linears) == 2 and all(n.args[2] is not None for n in linears), c.module.code
    assert c.module.code.count("add(") == 1, c.module.code  # the two sums' alone
    torch.testing.assert_close(c(*inputs), fn(*inputs))
    for a, b in zip(_grads(c, inputs), _grads(fn, inputs), strict=True):
        torch.testing.assert_close(a, b)


def test_a_product_does_not_move_past_a_write_to_its_input():
    """The product is not moved down to a bias computed after it when a call between them
    writes in place to what it reads: it would read the written values."""
    x = torch.randn(4, 3)
    w = torch.randn(2, 3)
    s = torch.randn(2, requires_grad=True)

    def fn(x, w, s):
        y = x.clone()
        a = F.linear(y, w)
        y.mul_(2.0)
        return (a + s * 2.0).sum() + y.sum()

    _, c = capture(fn, (x, w, s))
    torch.testing.assert_close(c(x, w, s), fn(x, w, s))
    torch.testing.assert_close(_grads(c, (x, w, s)), _grads(fn, (x, w, s)))


def test_sums_of_squares_replay_with_the_same_values_and_gradients():
    """Sums of squares as the loss has them (the Gaussian data term, the priors' squared
    weights, a partial sum first, a broadcast difference, a square something else reads):
    the replay's values and gradients are the call's, and the loss's constant rides in its
    stacked product (no addition left)."""
    torch.manual_seed(0)
    inputs = (
        torch.randn(6, 1, requires_grad=True),  # f
        torch.randn(6),  # y
        torch.randn(3, 2, requires_grad=True),  # w
        torch.randn(4, requires_grad=True),  # b
        torch.randn(2, 5, requires_grad=True),  # v
    )

    def fn(f, y, w, b, v):
        shared = v**2  # also read by the tanh
        data = ((y.unsqueeze(-1) - f) ** 2).sum()  # the Gaussian data term
        broadcast = ((y - f) ** 2).sum()  # (6,) − (6, 1): a broadcast
        rows = (w * w).sum(-1).sum()  # a partial sum first
        return (
            data
            + 0.5 * (w**2).sum()
            + (b * b).sum()
            + shared.sum()
            + shared.tanh().sum()
            + broadcast
            + rows
            + 3.0
        )

    _, c = capture(fn, inputs)
    torch.testing.assert_close(c(*inputs), fn(*inputs))
    for a, b in zip(_grads(c, inputs), _grads(fn, inputs), strict=True):
        torch.testing.assert_close(a, b)
    assert not [n for n in c.graph.nodes if n.target in (torch.Tensor.add, torch.add)], (
        c.module.code
    )


def test_squares_are_products_with_the_same_values_and_gradients_to_the_bit():
    """``pow(a, 2)`` (``a ** 2``, ``a.pow(2.0)``, ``torch.pow``) replays as ``a * a``: one
    kernel less in its backward, the same values to the bit; the same gradients (to the bit
    where the square is the input's only reader: ``g·a + g·a`` is ``g·(2a)``; elsewhere up to
    the order in which autograd adds the contributions); other powers stay."""
    torch.manual_seed(0)
    counts = torch.arange(6)  # an integer tensor (made inside: not folded into a constant)
    inputs = (torch.randn(50, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True))

    def fn(r, m):
        sd = F.softplus(r)
        var = sd**2  # read twice: not a full sum of squares
        k = (r[:6, 0] > 0).long() + counts  # ** 2.0 makes it float: stays a power
        return (
            var.log().sum()
            + (var * m).sum()
            + torch.pow(m, 2).tanh().sum()
            + m.pow(2.0).exp().sum()
            + m.pow(3).sum()
            + (k**2.0).sum()
        )

    _, c = capture(fn, inputs)
    targets = [n.target for n in c.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.Tensor.mul) == 4, c.module.code  # three squares, var * m
    pows = [n for n in c.graph.nodes if n.op == "call_function" and "pow" in str(n.target)]
    assert sorted(n.args[1] for n in pows) == [2.0, 3], c.module.code
    # the graph's constants are plain attributes (no nn.Module __getattr__ at each replay)
    assert not list(c.module.buffers())
    torch.testing.assert_close(c(*inputs), fn(*inputs), rtol=0, atol=0)
    (gr, gm), (er, em) = _grads(c, inputs), _grads(fn, inputs)
    torch.testing.assert_close(gr, er, rtol=0, atol=0)  # r reaches the loss through sd² only
    torch.testing.assert_close(gm, em)


def test_the_loss_sums_through_reshapes_but_not_through_a_view_as_another_dtype():
    """A full sum of a reshaped tensor is the full sum of the tensor (the reshape leaves the
    graph); a view of a float64 tensor's bits as float32 has other elements, so its sum stays
    its own term, and the replay equals the call."""
    torch.manual_seed(0)
    inputs = (torch.randn(3, 4, requires_grad=True), torch.randn(5, dtype=torch.float64))

    def fn(w, a):
        return (
            w.reshape(-1).sum()
            + 2.0 * w.unsqueeze(0).flatten().sum()
            + (w * w).sum()
            + a.view(torch.float32).sum()
        )

    _, c = capture(fn, inputs)
    code = c.module.code
    assert "reshape" not in code and "flatten" not in code and "unsqueeze" not in code, code
    assert "view" in code, code
    torch.testing.assert_close(c(*inputs), fn(*inputs))
    torch.testing.assert_close(_grads(c, inputs), _grads(fn, inputs))

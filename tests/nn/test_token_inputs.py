"""Weight draws on Linear inputs with token dims: ``(N, L, d)`` (a sequence or a set per
example) and ``(N, H, W, d)``, against a weight drawn ``(S, 1, out, in)`` (``S`` draws beside
the data plate's slot, as ``Predictive(parallel=True)`` and ``predict`` lay them out).

Each draw must meet every token of every example, as applying that draw's weight alone:
the reference is a Python loop of ``F.linear`` over the draws. Found by the zoo (issue 39):
the rule aligned the weight's batch dims with the input's from the right, so the token axis
took the data slot and the example axis met the draws ("size of tensor a (24) must match
... (3)"), and ``predict`` fell back to one draw per pass.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pyro import poutine

from pyro_dropout import AutoMeanField, weight_draws
from pyro_dropout.nn.functional import LayoutError, LinearSpec, read_rows
from pyro_dropout.nn.layers import BayesianLinear

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


def loop_over_draws(x, w, b, carries_draws):
    """``F.linear`` with draw ``s``'s weight (and bias) alone, stacked: ``(S, N, T..., out)``.
    ``w``: ``(S, 1, out, in)``; ``x``: ``(N, T..., d)``, or ``(S, N, T..., d)`` when it
    already carries the draws (a later layer's input)."""
    return torch.stack(
        [
            F.linear(x[s] if carries_draws else x, w[s, 0], None if b is None else b[s, 0])
            for s in range(w.shape[0])
        ]
    )


def _case(draws, examples, tokens, out, with_bias, carries_draws, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = 3
    lead = (draws,) if carries_draws else ()
    x = torch.randn(lead + (examples, *tokens, d), generator=g)
    w = torch.randn(draws, 1, out, d, generator=g)
    b = torch.randn(draws, 1, out, generator=g) if with_bias else None
    return x, w, b


def _close(actual, expected):
    """Equal to the loop; the same shape, except that one draw (a weight without sample
    dims) gives the plain ``F.linear`` shape, which broadcasts to the loop's."""
    if expected.shape[0] > 1:
        assert actual.shape == expected.shape
    actual = actual.expand(expected.shape)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [(), (5,), (5, 2)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("carries_draws", [False, True], ids=["data", "drawn-input"])
def test_the_zoo_shapes_equal_a_loop_over_draws(tokens, with_bias, carries_draws):
    """24 examples, 3 draws: the zoo's attention/DeepSets layout (raised on 6a8495c for the
    3-D and 4-D inputs)."""
    x, w, b = _case(3, 24, tokens, 2, with_bias, carries_draws)
    _close(LinearSpec()(x, w, b), loop_over_draws(x, w, b, carries_draws))
    # the transposed layout ``x @ w`` of a functional model
    _close(LinearSpec(transposed=True)(x, w.mT, b), loop_over_draws(x, w, b, carries_draws))


@SETTINGS
@given(
    draws=st.integers(1, 4),
    examples=st.integers(1, 5),
    tokens=st.lists(st.integers(1, 4), max_size=2),
    out=st.integers(1, 3),
    with_bias=st.booleans(),
    carries_draws=st.booleans(),
)
def test_given_token_dims_any_sizes_equal_a_loop(
    draws, examples, tokens, out, with_bias, carries_draws
):
    """``token_dims=len(T)``: the reading is given, so any sizes (the example axis as long as
    the draws included) give the loop's numbers and shape."""
    x, w, b = _case(draws, examples, tokens, out, with_bias, carries_draws)
    _close(LinearSpec()(x, w, b, token_dims=len(tokens)), loop_over_draws(x, w, b, carries_draws))
    b1 = None if b is None else b[..., :1]
    vector = LinearSpec(vector=True)
    got = vector(x, w[..., 0, :], None if b is None else b[..., 0], token_dims=len(tokens))
    _close(got, loop_over_draws(x, w[..., :1, :], b1, carries_draws)[..., 0])


@SETTINGS
@given(
    draws=st.integers(2, 4),
    examples=st.integers(1, 6),
    tokens=st.lists(st.integers(1, 4), max_size=2),
    with_bias=st.booleans(),
    carries_draws=st.booleans(),
)
def test_read_from_the_shapes_equal_a_loop(draws, examples, tokens, with_bias, carries_draws):
    """``LinearSpec()`` reads the token dims from the shapes: wherever they are unambiguous
    (no example or inner token axis of the draws' size), the loop's numbers and shape."""
    sizes = [examples, *tokens[:-1]]
    assume(all(n not in (1, draws) for n in sizes))
    x, w, b = _case(draws, examples, tokens, 2, with_bias, carries_draws)
    _close(LinearSpec()(x, w, b), loop_over_draws(x, w, b, carries_draws))


@pytest.mark.parametrize("draws_known, expected", [(0, (1, 2)), (1, (0, 1)), (None, (0, 1))])
def test_as_many_examples_as_draws_is_read_by_the_draws_known(draws_known, expected):
    """An input ``(S, L, d)`` against draws ``(S, 1, out, in)``: ``S`` examples of ``L``
    tokens (no dims of draws, 0) or ``L`` examples that carry the draws (1); shapes alone
    give the latter (Pyro's reading)."""
    assert read_rows(torch.Size([3, 5]), torch.Size([3, 1]), draws=draws_known) == expected


def test_input_with_other_draws_is_a_layout_error():
    with pytest.raises(LayoutError, match=r"carries 1 leading dims of draws \(\(2,\)"):
        read_rows(torch.Size([2, 24, 5]), torch.Size([3, 1]), draws=1)
    with pytest.raises(LayoutError, match=r"batch shape \(3, 1\).*\(2, 24, 5\) read as 1 token"):
        LinearSpec()(torch.randn(2, 24, 5, 4), torch.randn(3, 1, 2, 4), token_dims=1)
    with pytest.raises(LayoutError, match="has no 2 token dims"):
        LinearSpec()(torch.randn(24, 4), torch.randn(3, 1, 2, 4), token_dims=2)


# --------------------------------------------------------------------------------------------
# through weight_draws: GuidedValue ops and the library's layer, as Predictive runs them
# --------------------------------------------------------------------------------------------


def _functional(x):
    d = x.shape[-1]
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, d]).to_event(2))
    b = pyro.sample("b", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    h = torch.tanh(F.linear(x, w, b))  # (N, L, 2) per draw
    v = pyro.sample("v", dist.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
    return (h.mean(-2) @ v.mT).squeeze(-1)  # a later layer: its input carries the draws


class _Layered(pyro.nn.PyroModule):
    def __init__(self, d):
        super().__init__()
        self.layer = BayesianLinear(d, 2)

    def forward(self, x):
        return self.layer(x).sum(-1).mean(-1)


def _reference_functional(params, x):
    h = torch.tanh(F.linear(x, params["w"], params["b"]))
    return F.linear(h.mean(-2), params["v"]).squeeze(-1)


@pytest.mark.parametrize("examples", [24, 3], ids=["N24", "N-equals-draws"])
def test_predictive_parallel_on_token_inputs_equals_each_draw_alone(examples):
    """``Predictive(parallel=True)`` under ``weight_draws`` on ``(N, L, d)`` inputs, three
    draws: each draw's return value is that draw's plain-torch network, also with as many
    examples as draws (read by the input's rank in Predictive's first, draw-free run)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(examples, 5, 4)
    guide = AutoMeanField(_functional)
    guide(x)
    predictive = weight_draws(
        pyro.infer.Predictive(
            _functional, guide=guide, num_samples=3, parallel=True,
            return_sites=["w", "b", "v", "_RETURN"],
        )
    )  # fmt: skip
    out = predictive(x)
    for s in range(3):
        params = {k: out[k][s].reshape(out[k].shape[-2:] if k != "b" else (2,)) for k in "wbv"}
        want = _reference_functional(params, x)
        torch.testing.assert_close(out["_RETURN"][s].reshape(want.shape), want)


def test_library_layer_under_weight_draws_on_token_inputs():
    """``BayesianLinear`` (the effectful ``bayesian_layer``) on ``(N, L, d)`` with weights drawn
    in a vectorised plate: each draw's output is that draw's ``F.linear``."""
    pyro.set_rng_seed(0)
    model = _Layered(4)
    x = torch.randn(6, 5, 4)
    with weight_draws():
        with pyro.plate("draws", 3, dim=-2):
            tr = poutine.trace(model).get_trace(x)
    w, b = tr.nodes["layer.weight"]["value"], tr.nodes["layer.bias"]["value"]
    w, b = w.reshape(3, 2, 4), b.reshape(3, 2)
    want = torch.stack([F.linear(x, w[s], b[s]).sum(-1).mean(-1) for s in range(3)])
    torch.testing.assert_close(tr.nodes["_RETURN"]["value"].reshape(want.shape), want)


def test_other_draws_on_an_input_name_the_site():
    """An input that carries draws of another size than the weight's (2 against 3): a
    ``LayoutError`` naming the weight site and both shapes, not torch's broadcasting error."""
    x = torch.randn(24, 5, 4)
    w = dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2)

    def model(x):
        return F.linear(x, pyro.sample("w", w))

    with weight_draws():
        model(x)  # a draw-free run: the input's rank at site "w" is 3
        with pyro.plate("draws", 3, dim=-2):
            with pytest.raises(LayoutError, match=r"weight site 'w'.*\(2, 24, 5, 4\).*\(3, 1\)"):
                model(x.expand(2, 24, 5, 4))

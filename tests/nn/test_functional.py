"""``LinearSpec`` / ``ConvSpec``: batched linear maps and convolutions against a reference that
loops ``F.linear`` / ``F.conv1d`` / ``F.conv2d`` over every (broadcast) batch position.

Weight batch shapes ``()``, ``(S,)``, ``(S, 1)``, ``(P, S, 1)`` are the layouts the layers see
(no sample dim; Predictive's samples; a sample plate at dim -2 beside the data plate; particles
and samples); inputs come with and without leading dims. Hypothesis then draws arbitrary
mutually broadcastable batch shapes.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from pyro_dropout.nn.functional import ConvSpec, LinearSpec, add_bias, bayesian_layer, unexpand

S, P, N = 3, 2, 5
HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


# --------------------------------------------------------------------------------------------
# references: a Python loop of the unbatched torch op
# --------------------------------------------------------------------------------------------


def _flat(t, batch, event_ndim):
    event = t.shape[t.dim() - event_ndim :]
    return t.expand(batch + event).reshape((-1,) + event)


def ref_linear(x, weight, bias=None):
    batch = torch.broadcast_shapes(x.shape[:-1], weight.shape[:-2])
    if bias is not None:
        batch = torch.broadcast_shapes(batch, bias.shape[:-1])
    xs, ws = _flat(x, batch, 1), _flat(weight, batch, 2)
    bs = None if bias is None else _flat(bias, batch, 1)
    rows = [F.linear(xs[i], ws[i], None if bs is None else bs[i]) for i in range(math.prod(batch))]
    return torch.stack(rows).reshape(batch + weight.shape[-2:-1])


def ref_conv(x, weight, spec):
    nd = spec.ndim
    fn = F.conv1d if nd == 1 else F.conv2d
    batch = torch.broadcast_shapes(x.shape[: -(1 + nd)], weight.shape[: -(2 + nd)])
    xs, ws = _flat(x, batch, 1 + nd), _flat(weight, batch, 2 + nd)
    outs = [
        fn(xs[i][None], ws[i], None, spec.stride, spec.padding, spec.dilation, spec.groups)[0]
        for i in range(math.prod(batch))
    ]
    return torch.stack(outs).reshape(batch + outs[0].shape)


def _close(actual, expected):
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# LinearSpec
# --------------------------------------------------------------------------------------------

WEIGHT_BATCHES = {"none": (), "S": (S,), "S1": (S, 1), "PS1": (P, S, 1)}
LINEAR_INPUT_BATCHES = {
    # weight batch -> input batches it must broadcast against
    "none": [(N,), (S, N), (P, S, N), ()],
    "S": [(S,), (N, S), (P, 1, S)],  # one weight per row of a batch of S inputs
    "S1": [(N,), (S, N), (1, N), (P, S, N)],
    "PS1": [(N,), (S, N), (P, S, N), (P, 1, N)],
}
LINEAR_CASES = [
    pytest.param(WEIGHT_BATCHES[w], xb, id=f"w{w}-x{'x'.join(map(str, xb)) or 'none'}")
    for w, xbs in LINEAR_INPUT_BATCHES.items()
    for xb in xbs
]


@pytest.mark.parametrize("w_batch, x_batch", LINEAR_CASES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear_matches_loop_of_f_linear(w_batch, x_batch, with_bias):
    torch.manual_seed(0)
    x = torch.randn(x_batch + (4,))
    w = torch.randn(w_batch + (3, 4))
    b = torch.randn(w_batch + (3,)) if with_bias else None
    _close(LinearSpec()(x, w, b), ref_linear(x, w, b))


def test_linear_plain_gemm_equals_f_linear():
    torch.manual_seed(0)
    x, w, b = torch.randn(N, 4), torch.randn(3, 4), torch.randn(3)
    torch.testing.assert_close(LinearSpec()(x, w, b), F.linear(x, w, b))


def test_linear_expanded_weight_gives_same_result_as_compact():
    """Stride-0 (``expand``-ed) weights, as Pyro's plates produce, are unexpanded first."""
    torch.manual_seed(0)
    x = torch.randn(S, N, 4)
    w = torch.randn(S, 1, 3, 4)
    expanded = w.expand(S, N, 3, 4)
    _close(LinearSpec()(x, expanded), ref_linear(x, w))


def test_linear_is_differentiable_in_weight_and_input():
    torch.manual_seed(0)
    x = torch.randn(S, N, 4, requires_grad=True)
    w = torch.randn(S, 1, 3, 4, requires_grad=True)
    LinearSpec()(x, w).square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref_linear(x, w).square().sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


@HYPOTHESIS
@given(
    shapes=mutually_broadcastable_shapes(
        signature="(i),(o,i)->(o)", min_dims=0, max_dims=3, min_side=1, max_side=3
    ),
    with_bias=st.booleans(),
)
def test_linear_property_broadcasts_like_a_loop(shapes, with_bias):
    """Any mutually broadcastable (input, weight) batch shapes: values equal the loop; the
    result broadcasts to the loop's shape (see :func:`test_linear_keeps_singleton_lead_dims`)."""
    torch.manual_seed(0)
    x_shape, w_shape = shapes.input_shapes
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    b = torch.randn(w_shape[:-1]) if with_bias else None
    out = LinearSpec()(x, w, b)
    expected = ref_linear(x, w, b)
    assert out.dim() <= expected.dim()
    torch.testing.assert_close(out.expand(expected.shape), expected, rtol=1e-5, atol=1e-5)
    # Only leading singleton dims may be missing.
    assert out.shape == expected.shape[expected.dim() - out.dim() :]
    assert math.prod(expected.shape[: expected.dim() - out.dim()]) == 1


# --------------------------------------------------------------------------------------------
# ConvSpec
# --------------------------------------------------------------------------------------------

CONV_SPECS = {
    "2d": ConvSpec(2),
    "2d-stride-pad": ConvSpec(2, stride=(2, 1), padding=(1, 2)),
    "2d-dilation": ConvSpec(2, dilation=(2, 1), padding=(2, 0)),
    "2d-groups": ConvSpec(2, groups=2, padding=(1, 1)),
    "2d-same": ConvSpec(2, padding="same", dilation=(1, 2)),
    "1d": ConvSpec(1, stride=(1,), padding=(0,), dilation=(1,)),
    "1d-all": ConvSpec(1, stride=(2,), padding=(1,), dilation=(2,), groups=2),
    "1d-same": ConvSpec(1, stride=(1,), padding="same", dilation=(1,)),
}
CONV_INPUT_BATCHES = {
    "none": [(N,), (S, N), ()],
    "S": [(S,), (P, S)],
    "S1": [(N,), (S, N), (P, S, N)],
    "PS1": [(N,), (S, N), (P, S, N), (P, 1, N)],
}
CONV_CASES = [
    pytest.param(WEIGHT_BATCHES[w], xb, id=f"w{w}-x{'x'.join(map(str, xb)) or 'none'}")
    for w, xbs in CONV_INPUT_BATCHES.items()
    for xb in xbs
]


def _conv_tensors(spec, w_batch, x_batch, c_in=4, c_out=6, side=7, k=3):
    spatial = (side,) * spec.ndim
    kernel = (k,) * spec.ndim
    x = torch.randn(x_batch + (c_in,) + spatial)
    w = torch.randn(w_batch + (c_out, c_in // spec.groups) + kernel)
    return x, w


@pytest.mark.parametrize("spec", CONV_SPECS.values(), ids=CONV_SPECS.keys())
@pytest.mark.parametrize("w_batch, x_batch", CONV_CASES)
def test_conv_matches_loop_of_f_conv(spec, w_batch, x_batch):
    torch.manual_seed(0)
    x, w = _conv_tensors(spec, w_batch, x_batch)
    _close(spec(x, w), ref_conv(x, w, spec))


def test_conv2d_plain_equals_f_conv2d():
    torch.manual_seed(0)
    spec = ConvSpec(2, stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=2)
    x, w = torch.randn(N, 4, 9, 9), torch.randn(6, 2, 3, 3)
    torch.testing.assert_close(spec(x, w), F.conv2d(x, w, None, 2, 1, 1, 2))


def test_conv_expanded_kernel_gives_same_result_as_compact():
    torch.manual_seed(0)
    spec = ConvSpec(2, padding=(1, 1))
    x = torch.randn(S, N, 4, 6, 6)
    w = torch.randn(S, 1, 6, 4, 3, 3)
    _close(spec(x, w.expand(S, N, 6, 4, 3, 3)), ref_conv(x, w, spec))


@pytest.mark.parametrize("ndim", [1, 2])
def test_conv_add_bias_broadcasts_over_positions(ndim):
    torch.manual_seed(0)
    spec = ConvSpec(ndim, (1,) * ndim, (1,) * ndim, (1,) * ndim)
    x, w = _conv_tensors(spec, (S, 1), (N,))
    b = torch.randn(S, 1, 6)
    out = add_bias(spec(x, w), b, spec)
    expected = ref_conv(x, w, spec) + b[(...,) + (None,) * ndim]
    _close(out, expected)
    assert add_bias(out, None, spec) is out


@HYPOTHESIS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
    ndim=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 2]),
    stride=st.integers(1, 2),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    kernel=st.integers(1, 3),
    side=st.integers(5, 7),
)
def test_conv_property_broadcasts_like_a_loop(
    shapes, ndim, groups, stride, padding, dilation, kernel, side
):
    torch.manual_seed(0)
    x_batch, w_batch = (tuple(s) for s in shapes.input_shapes)
    spec = ConvSpec(ndim, (stride,) * ndim, (padding,) * ndim, (dilation,) * ndim, groups)
    x, w = _conv_tensors(spec, w_batch, x_batch, c_in=2 * groups, c_out=2 * groups, side=side)
    _close(spec(x, w), ref_conv(x, w, spec))


# --------------------------------------------------------------------------------------------
# the effectful op without handlers: plain application of the weights
# --------------------------------------------------------------------------------------------


def test_bayesian_layer_without_handler_applies_weights():
    torch.manual_seed(0)
    x, w, b = torch.randn(S, N, 4), torch.randn(S, 1, 3, 4), torch.randn(S, 1, 3)
    out = bayesian_layer(x, w, b, spec=LinearSpec(), bias_name="b", name="w")
    _close(out, ref_linear(x, w, b))
    spec = ConvSpec(2, padding=(1, 1))
    xc, wc = _conv_tensors(spec, (S, 1), (N,))
    bc = torch.randn(S, 1, 6)
    out = bayesian_layer(xc, wc, bc, spec=spec, bias_name="b", name="w")
    _close(out, ref_conv(xc, wc, spec) + bc[..., None, None])


# --------------------------------------------------------------------------------------------
# unexpand
# --------------------------------------------------------------------------------------------


def test_unexpand_shrinks_broadcast_dims_to_one():
    base = torch.randn(3, 1, 4)
    t = base.expand(2, 3, 5, 4)
    u = unexpand(t)
    assert u.shape == (1, 3, 1, 4)
    assert torch.equal(u.expand(t.shape), t)
    assert u.data_ptr() == base.data_ptr()  # a view, no copy


def test_unexpand_returns_ordinary_tensors_unchanged():
    t = torch.randn(3, 1, 4)
    assert unexpand(t) is t
    scalar = torch.tensor(2.0)
    assert unexpand(scalar) is scalar
    # A size-1 dim with stride 0 is already compact.
    one = torch.randn(4).expand(1, 4)
    assert unexpand(one) is one


def test_unexpand_of_fully_expanded_scalar():
    t = torch.tensor(1.5).expand(3, 2)
    u = unexpand(t)
    assert u.shape == (1, 1)
    assert float(u) == 1.5


@HYPOTHESIS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=1, min_dims=0, max_dims=4, max_side=3),
    data=st.data(),
)
def test_unexpand_property(shapes, data):
    """``unexpand(t.expand(s))`` has size 1 exactly where ``t`` was broadcast, and expands back."""
    (small,) = shapes.input_shapes
    big = shapes.result_shape
    extra = data.draw(st.lists(st.integers(2, 3), max_size=2))
    big = tuple(extra) + tuple(big)
    torch.manual_seed(0)
    t = torch.randn(small)
    e = t.expand(big)
    u = unexpand(e)
    assert torch.equal(u.expand(big), e)
    pad = (1,) * (len(big) - len(small)) + tuple(small)
    expected = tuple(1 if (p == 1) else n for p, n in zip(pad, big, strict=True))
    assert u.shape == expected

"""What a guided weight does in the code users write, beyond the ops of ``test_user_ops.py``.

* ``F.linear`` with a bias (guided or plain, positional or keyword) adds that bias, under
  weight draws (exactly, draw by draw) and under local reparameterisation;
* every spelling of a matrix transpose (keywords, tuples, negative dims, ``torch.*`` forms) keeps
  the site, so the product that follows is answered by the rule (``strict=True`` raises on any
  fallback), and the transposed value has the transposed shape and values, also with a plate of
  draws in front; a single unbatched example ``x`` (shape ``(in,)``) is answered too;
* transposes that leave the matrix as it is, ops without a rule on a transposed value, keyword
  arguments of those ops, products of two guided matrices, ``out=``, a batch of matrices and a
  plate of weight vectors compute on the drawn values, and are reported (once per site) where
  the docs say so, naming the operation.

"Nearly deterministic" runs use a posterior scale of 1e-4: sampled outputs stay within ~1e-3 of
the product with the posterior mean, while a lost bias or a wrong transpose changes them by
O(1) or changes their shape.
"""

import re

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_unary

from pyro_dropout import local_reparameterization, weight_draws
from pyro_dropout.handlers import LocalReparameterizationWarning
from pyro_dropout.handlers.guided_value import plain

H, D, S = 4, 3, 3
TINY = 1e-4
ATOL = 1e-2

_g = torch.Generator().manual_seed(0)
W_LOC = torch.randn(H, D, generator=_g)
B_LOC = torch.randn(H, generator=_g)
X = torch.randn(5, D, generator=_g)


def _sample(name, loc, scale):
    return pyro.sample(name, dist.Normal(loc, torch.full_like(loc, scale)).to_event(loc.dim()))


def _messages(record):
    return [str(w.message) for w in record if w.category is LocalReparameterizationWarning]


# --------------------------------------------------------------------------------------------
# F.linear with a bias
# --------------------------------------------------------------------------------------------

LINEAR_CALLS = {
    "F.linear(x, w, b)": lambda x, w, b: F.linear(x, w, b),
    "F.linear(x, w, bias=b)": lambda x, w, b: F.linear(x, w, bias=b),
    "F.linear(input=x, weight=w, bias=b)": lambda x, w, b: F.linear(input=x, weight=w, bias=b),
    "F.linear(x, weight=w, bias=b)": lambda x, w, b: F.linear(x, weight=w, bias=b),
}


@pytest.mark.parametrize("guided_bias", [True, False], ids=["guided_bias", "plain_bias"])
@pytest.mark.parametrize("call_name", sorted(LINEAR_CALLS))
def test_linear_adds_the_bias_under_weight_draws(call_name, guided_bias):
    """A plate of S weight (and bias) draws: each output is F.linear with that draw's bias."""
    call = LINEAR_CALLS[call_name]
    with weight_draws():
        with pyro.plate("draws", S, dim=-2):
            w = _sample("w", W_LOC, 0.5)
            b = _sample("b", B_LOC, 0.5) if guided_bias else B_LOC
        out = call(X, w, b)
    w_plain, b_plain = plain(w), plain(b)
    bs = [b_plain[s, 0] if guided_bias else b_plain for s in range(S)]
    ref = torch.stack([F.linear(X, w_plain[s, 0], bs[s]) for s in range(S)])
    assert out.shape == ref.shape == (S, 5, H)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("guided_bias", [True, False], ids=["guided_bias", "plain_bias"])
@pytest.mark.parametrize("call_name", sorted(LINEAR_CALLS))
def test_linear_adds_the_bias_under_local_reparameterization(call_name, guided_bias):
    """Nearly deterministic posterior: the rule's output is F.linear with the mean weight plus
    the (mean of the) bias, for a guided bias (folded into the Gaussian) or a plain one."""
    call = LINEAR_CALLS[call_name]
    with local_reparameterization(strict=True):
        w = _sample("w", W_LOC, TINY)
        b = _sample("b", B_LOC, TINY) if guided_bias else B_LOC
        out = call(X, w, b)
    torch.testing.assert_close(out, F.linear(X, W_LOC, B_LOC), rtol=0, atol=ATOL)
    assert (out - F.linear(X, W_LOC, B_LOC)).abs().max() > 0  # sampled


def test_a_plain_weight_with_a_guided_bias_uses_the_drawn_bias():
    """Only the bias is Bayesian: F.linear runs with the plain weight and the drawn bias; a
    vector site used as drawn is not reported (strict would raise)."""
    with local_reparameterization(strict=True):
        b = _sample("b", B_LOC, 0.5)
        out = F.linear(X, W_LOC, b)
        out_kw = F.linear(X, weight=W_LOC, bias=b)
    torch.testing.assert_close(out, F.linear(X, W_LOC, plain(b)))
    torch.testing.assert_close(out_kw, out)


# --------------------------------------------------------------------------------------------
# transposes
# --------------------------------------------------------------------------------------------

TRANSPOSES = {
    "w.T": lambda w: w.T,
    "w.mT": lambda w: w.mT,
    "w.t()": lambda w: w.t(),
    "torch.t(w)": lambda w: torch.t(w),
    "w.transpose(dim0=0, dim1=1)": lambda w: w.transpose(dim0=0, dim1=1),
    "w.transpose(1, dim1=0)": lambda w: w.transpose(1, dim1=0),
    "w.transpose(-2, -1)": lambda w: w.transpose(-2, -1),
    "torch.transpose(w, 1, 0)": lambda w: torch.transpose(w, 1, 0),
    "w.permute(1, 0)": lambda w: w.permute(1, 0),
    "w.permute(-1, -2)": lambda w: w.permute(-1, -2),
    "w.permute(1, -2)": lambda w: w.permute(1, -2),
    "w.permute((1, 0))": lambda w: w.permute((1, 0)),
    "w.permute([-1, 0])": lambda w: w.permute([-1, 0]),
    "w.permute(dims=(1, 0))": lambda w: w.permute(dims=(1, 0)),
    "torch.permute(w, (1, 0))": lambda w: torch.permute(w, (1, 0)),
    "torch.permute(w, dims=(-1, -2))": lambda w: torch.permute(w, dims=(-1, -2)),
    "torch.t(input=w)": lambda w: torch.t(input=w),
    "torch.transpose(input=w, dim0=0, dim1=1)": lambda w: torch.transpose(input=w, dim0=0, dim1=1),
    "torch.permute(input=w, dims=(1, 0))": lambda w: torch.permute(input=w, dims=(1, 0)),
}
UNBATCHED_ONLY = {
    "w.T",
    "w.t()",
    "torch.t(w)",
    "torch.t(input=w)",
}  # torch defines these for matrices only


@pytest.mark.parametrize("name", sorted(TRANSPOSES))
def test_every_transpose_spelling_keeps_the_site_for_the_product(name):
    """``x @ transpose(w)`` is answered by the rule (strict: no fallback), for a batch of rows
    and for a single unbatched example, and matches the product with the mean weight."""
    t = TRANSPOSES[name]
    with local_reparameterization(strict=True):
        out = X @ t(_sample("w", W_LOC, TINY))
    with local_reparameterization(strict=True):
        out_row = X[0] @ t(_sample("w", W_LOC, TINY))
    assert out.shape == (5, H) and out_row.shape == (H,)
    torch.testing.assert_close(out, X @ W_LOC.T, rtol=0, atol=ATOL)
    torch.testing.assert_close(out_row, X[0] @ W_LOC.T, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", sorted(set(TRANSPOSES) - UNBATCHED_ONLY))
def test_transposed_draws_have_the_transposed_shape_and_values(name):
    """With a plate of S draws in front, a transpose swaps the two matrix dims of every draw
    (shape, values) and the product applies each drawn matrix."""
    t = TRANSPOSES[name]
    with weight_draws():
        with pyro.plate("draws", S, dim=-2):
            w = _sample("w", W_LOC, 0.5)
        wt = t(w)
        out = X @ wt
    w_plain = plain(w)
    assert wt.shape == (S, 1, D, H)
    torch.testing.assert_close(plain(wt), w_plain.transpose(-1, -2))
    ref = torch.stack([X @ w_plain[s, 0].T for s in range(S)])
    torch.testing.assert_close(out, ref)


IDENTITIES = {
    "w.permute(0, 1)": lambda w: w.permute(0, 1),
    "w.permute(-2, -1)": lambda w: w.permute(-2, -1),
    "w.transpose(1, 1)": lambda w: w.transpose(1, 1),
    "w.transpose(0, -2)": lambda w: w.transpose(0, -2),
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
def test_a_transpose_that_keeps_the_dims_returns_the_matrix_as_is(name):
    """Transposing a dim with itself, or the identity permutation, is no transpose: the drawn
    matrix comes back unchanged; having no rule, the use is reported under LRT."""
    op = IDENTITIES[name]
    with weight_draws():
        w = _sample("w", W_LOC, 0.5)
        same = op(w)
    assert same.shape == (H, D)
    torch.testing.assert_close(same, plain(w))
    with pytest.warns(LocalReparameterizationWarning, match="'w' is used by Tensor.") as record:
        with local_reparameterization():
            w = _sample("w", W_LOC, 0.5)
            same = op(w)
    assert len(_messages(record)) == 1
    assert same.shape == (H, D)
    torch.testing.assert_close(same, plain(w))


# --------------------------------------------------------------------------------------------
# operations without a rule compute on the drawn values
# --------------------------------------------------------------------------------------------

ELEMENTWISE = {
    "torch.tanh(w.T)": lambda w: torch.tanh(w.T),
    "w.mT * 2": lambda w: w.mT * 2.0,
    "w.mT.sum(dim=-2)": lambda w: w.mT.sum(dim=-2),
    "w.mT.sum(dim=-1, keepdim=True)": lambda w: w.mT.sum(dim=-1, keepdim=True),
    "torch.cumsum(w.mT, dim=-1)": lambda w: torch.cumsum(w.mT, dim=-1),
}


ELEMENTWISE_CASES = [
    (name, plate_dim)
    for name in sorted(ELEMENTWISE)
    for plate_dim in ((None,) if name == "torch.tanh(w.T)" else (None, -1, -2))
]  # w.T is defined for matrices only


@pytest.mark.parametrize(("name", "plate_dim"), ELEMENTWISE_CASES)
def test_ops_without_a_rule_see_the_transposed_draws(name, plate_dim):
    """An op without a rule on a transposed weight (with its keyword arguments) computes on
    the drawn values in the transposed layout, unbatched or with a plate of draws."""
    op = ELEMENTWISE[name]
    with weight_draws():
        if plate_dim is None:
            w = _sample("w", W_LOC, 0.5)
        else:
            with pyro.plate("draws", S, dim=plate_dim):
                w = _sample("w", W_LOC, 0.5)
        out = op(w)
    ref = {
        "torch.tanh(w.T)": lambda v: torch.tanh(v.transpose(-1, -2)),
        "w.mT * 2": lambda v: v.transpose(-1, -2) * 2.0,
        "w.mT.sum(dim=-2)": lambda v: v.transpose(-1, -2).sum(dim=-2),
        "w.mT.sum(dim=-1, keepdim=True)": lambda v: v.transpose(-1, -2).sum(-1, keepdim=True),
        "torch.cumsum(w.mT, dim=-1)": lambda v: torch.cumsum(v.transpose(-1, -2), dim=-1),
    }[name](plain(w))
    assert type(out) is torch.Tensor
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref)


def test_a_plate_of_weight_vectors_multiplies_as_drawn():
    """Weight vectors drawn in a plate of units (``w`` of shape (units, in), event dim 1):
    ``x @ w.T`` is the plain product of the drawn vectors, with no report (vector sites are
    used as drawn)."""
    loc = torch.randn(H, D, generator=torch.Generator().manual_seed(3))
    for handler in (weight_draws, lambda: local_reparameterization(strict=True)):
        with handler(), pyro.plate("units", H, dim=-1):
            w = pyro.sample("w", dist.Normal(loc, 0.5).to_event(1))  # (H, D)
            out = X @ w.T
        assert out.shape == (5, H)
        torch.testing.assert_close(out, X @ plain(w).T)


def test_a_batch_of_matrices_is_multiplied_as_drawn_and_reported():
    """A site holding a batch of matrices (event dim 3) has no rule for ``@``: the product uses
    the drawn matrices and the first op meeting the site is named once (the ``mT`` attribute,
    or ``matmul``); strict raises."""
    loc = torch.randn(2, D, H, generator=torch.Generator().manual_seed(4))
    uses = {
        "x @ w": (lambda w: X @ w, lambda v: X @ v, "Tensor.matmul"),
        "torch.matmul(x, w)": (lambda w: torch.matmul(X, w), lambda v: X @ v, r"\S*matmul"),
        "x @ w.mT.mT": (lambda w: X @ w.mT.mT, lambda v: X @ v, "a tensor attribute"),
    }
    for use, ref, op_name in uses.values():
        with pytest.warns(LocalReparameterizationWarning) as record:
            with local_reparameterization():
                w = _sample("w", loc, 0.5)
                out = use(w)
        messages = _messages(record)
        assert len(messages) == 1
        assert re.search(f"'w' is used by {op_name}, which", messages[0])
        torch.testing.assert_close(out, ref(plain(w)))
        with pytest.raises(NotImplementedError, match="'w' is used by"):
            with local_reparameterization(strict=True):
                use(_sample("w", loc, 0.5))


PRODUCTS = {
    "a @ b": lambda a, b: a @ b,
    "torch.matmul(a, b)": lambda a, b: torch.matmul(a, b),
    "torch.mm(a, b)": lambda a, b: torch.mm(a, b),
    "a.matmul(b)": lambda a, b: a.matmul(b),
    "F.linear(a, b.T)": lambda a, b: F.linear(a, b.T),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_a_product_of_two_guided_matrices_is_computed_as_drawn_and_reports_both(name):
    """A low-rank weight ``a @ b`` of two guided factors: no rule covers a product of two
    weights, so the drawn factors are multiplied and both sites are reported."""
    prod = PRODUCTS[name]
    g = torch.Generator().manual_seed(5)
    a_loc, b_loc = torch.randn(H, 2, generator=g), torch.randn(2, D, generator=g)
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization():
            a = _sample("a", a_loc, 0.5)
            b = _sample("b", b_loc, 0.5)
            w = prod(a, b)
            out = F.linear(X, w)
    reported = sorted(m.split("weight site ")[1].split(" ")[0] for m in _messages(record))
    assert reported == ["'a'", "'b'"]
    torch.testing.assert_close(w, plain(a) @ plain(b))
    torch.testing.assert_close(out, X @ (plain(a) @ plain(b)).T)


def test_matmul_into_an_out_tensor_computes_as_drawn_and_reports():
    """``torch.matmul(x, w.T, out=o)`` has no rule: ``o`` receives the product with the drawn
    weight and the use is reported."""
    o = torch.empty(5, H)
    with pytest.warns(LocalReparameterizationWarning, match="'w' is used by .*matmul"):
        with local_reparameterization(), torch.no_grad():
            w = _sample("w", W_LOC, 0.5)
            torch.matmul(X, w.T, out=o)
    torch.testing.assert_close(o, X @ plain(w).T)


# --------------------------------------------------------------------------------------------
# names of the reported operations
# --------------------------------------------------------------------------------------------


class _UserOp:
    """A user-defined op that dispatches through torch's ``__torch_function__`` protocol."""

    def __call__(self, t):
        if has_torch_function_unary(t):
            return handle_torch_function(self, (t,), t)
        return 2.0 * t

    def __repr__(self):
        return "<user op double>"


def _reported_name(op, expected=lambda v: 2.0 * v):
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization():
            w = _sample("w", W_LOC, 0.5)
            out = op(w)
    torch.testing.assert_close(out, expected(plain(w)))
    (message,) = _messages(record)
    return message.split("is used by ", 1)[1].split(", which has no", 1)[0]


def test_reported_operations_are_named_by_qualname_name_or_repr():
    """The warning names the operation by its ``__qualname__``, else its ``__name__``, else its
    ``repr``; torch's tensor-base class is spelled ``Tensor.`` in every torch version
    (``_TensorBase.`` before torch 2.2, ``TensorBase.`` after) and torch's functions ``torch.``
    (``_VariableFunctionsClass.`` internally)."""
    assert _reported_name(_UserOp()) == "<user op double>"
    op = _UserOp()
    op.__name__ = "double"
    assert _reported_name(op) == "double"
    for qualname in (
        "_TensorBase.double",
        "TensorBase.double",
        "_VariableFunctionsClass.double",
        "MyOps.double",
    ):
        op = _UserOp()
        op.__qualname__ = qualname
        op.__name__ = "ignored"
        expected = {"M": "MyOps.double", "_V": "torch.double"}.get(
            qualname[:2] if qualname.startswith("_V") else qualname[0], "Tensor.double"
        )
        assert _reported_name(op) == expected
    # torch's tensor attributes (``w.mH``, ``w.H``) are reported as such
    mh = _reported_name(lambda w: X @ w.mH, expected=lambda v: X @ v.T)
    assert mh == "a tensor attribute"


def test_metadata_queries_with_keyword_arguments():
    """``w.size(dim=...)``, ``w.stride(dim=...)`` on a guided value answer like torch's (they
    bypass the rules, keywords included)."""
    with local_reparameterization():
        w = _sample("w", torch.zeros(4, 3), 1.0)
        assert w.size(dim=1) == 3 and w.size(dim=0) == 4
        assert w.stride(dim=0) == plain(w).stride(0)

"""``F.conv1d`` / ``F.conv2d`` on a guided kernel, called the ways user code calls them.

A functional model (or ``PyroModule[nn.Conv*d]``) may pass the convolution's arguments
positionally, by keyword, or leave them at their defaults; padding may be a string. Whatever the
spelling, the operation routed to the local-reparameterisation handler must be the one the user
wrote: under :func:`~pyro_dropout.weight_draws` the result equals the same convolution applied
with each drawn kernel (exactly, draw by draw), and under
:func:`~pyro_dropout.local_reparameterization` (``strict=True``, so no silent fallback) a nearly
deterministic posterior (σ = 1e-4) gives the convolution with the posterior mean.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F

from pyro_dropout import local_reparameterization, weight_draws
from pyro_dropout.handlers import LocalReparameterizationWarning
from pyro_dropout.handlers.guided_value import plain

S = 3  # weight draws in the vectorised (plated) runs
TINY = 1e-4  # posterior scale of the "nearly deterministic" runs
#: With σ = 1e-4 the sampled outputs stay within ~1e-3 of the mean convolution; any change of
#: stride, padding, dilation, groups or bias changes them by O(1) (or changes their shape).
ATOL = 1e-2

_g = torch.Generator().manual_seed(0)
X2 = torch.randn(2, 4, 6, 6, generator=_g)
X1 = torch.randn(2, 4, 7, generator=_g)
KERNELS = {
    # name -> (kernel loc, bias loc, input)
    "conv2d": (torch.randn(4, 2, 3, 3, generator=_g), torch.randn(4, generator=_g), X2),
    "conv2d_dense": (torch.randn(4, 4, 3, 3, generator=_g), torch.randn(4, generator=_g), X2),
    "conv1d": (torch.randn(4, 2, 3, generator=_g), torch.randn(4, generator=_g), X1),
    "conv1d_dense": (torch.randn(4, 4, 3, generator=_g), torch.randn(4, generator=_g), X1),
}

#: name -> (kernel, call(x, w, b)): every argument of F.conv*d, positionally, by keyword,
#: defaulted, with non-default values (strides, padding strings, dilation, groups).
CALLS = {
    "conv2d(x, w)": ("conv2d_dense", lambda x, w, b: F.conv2d(x, w)),
    "conv2d(x, w, b)": ("conv2d_dense", lambda x, w, b: F.conv2d(x, w, b)),
    "conv2d all positional": ("conv2d", lambda x, w, b: F.conv2d(x, w, b, 2, 1, 2, 2)),
    "conv2d tuple positional": (
        "conv2d",
        lambda x, w, b: F.conv2d(x, w, b, (2, 1), (1, 0), (1, 2), 2),
    ),
    "conv2d all keywords": (
        "conv2d",
        lambda x, w, b: F.conv2d(
            input=x, weight=w, bias=b, stride=(1, 2), padding=(0, 1), dilation=2, groups=2
        ),
    ),
    "conv2d padding='same'": (
        "conv2d",
        lambda x, w, b: F.conv2d(x, w, bias=b, padding="same", dilation=(2, 1), groups=2),
    ),
    "conv2d padding='valid'": ("conv2d_dense", lambda x, w, b: F.conv2d(x, w, padding="valid")),
    "conv2d stride only": ("conv2d_dense", lambda x, w, b: F.conv2d(x, w, b, stride=2)),
    "conv1d(x, w)": ("conv1d_dense", lambda x, w, b: F.conv1d(x, w)),
    "conv1d all positional": ("conv1d", lambda x, w, b: F.conv1d(x, w, b, 2, 1, 2, 2)),
    "conv1d all keywords": (
        "conv1d",
        lambda x, w, b: F.conv1d(
            input=x, weight=w, bias=b, stride=2, padding=2, dilation=2, groups=2
        ),
    ),
    "conv1d padding='same'": (
        "conv1d",
        lambda x, w, b: F.conv1d(x, w, b, padding="same", dilation=3, groups=2),
    ),
}


def _sites(kernel, scale):
    w_loc, b_loc, x = KERNELS[kernel]
    w = pyro.sample("w", dist.Normal(w_loc, torch.full_like(w_loc, scale)).to_event(w_loc.dim()))
    b = pyro.sample("b", dist.Normal(b_loc, torch.full_like(b_loc, scale)).to_event(1))
    return w, b, x


@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_weight_draws_apply_each_drawn_kernel_with_the_callers_arguments(call_name):
    """Under weight_draws() a plate of S kernel draws gives, for each draw, exactly the user's
    convolution with that draw (arguments as passed, defaults as torch's)."""
    kernel, call = CALLS[call_name]
    with weight_draws():
        with pyro.plate("draws", S, dim=-2):
            w, b, x = _sites(kernel, 0.5)
        out = call(x, w, b)
    w_plain, b_plain = plain(w), plain(b)
    ref = torch.stack([call(x, w_plain[s, 0], b_plain[s, 0]) for s in range(S)])
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call_name", sorted(CALLS))
def test_local_reparameterization_convolves_with_the_callers_arguments(call_name):
    """Under local_reparameterization(strict=True) the convolution is answered by the rule (no
    fallback, which would raise) and, for a nearly deterministic posterior, equals the user's
    convolution with the posterior means of kernel and bias."""
    kernel, call = CALLS[call_name]
    w_loc, b_loc, _ = KERNELS[kernel]
    with local_reparameterization(strict=True):
        w, b, x = _sites(kernel, TINY)
        out = call(x, w, b)
    ref = call(x, w_loc, b_loc)
    assert type(out) is torch.Tensor
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    assert (out - ref).abs().max() > 0  # sampled, not the mean itself


@pytest.mark.parametrize("conv", ["conv1d", "conv2d"])
def test_a_plain_kernel_with_a_guided_bias_uses_the_drawn_bias(conv):
    """Only the bias is Bayesian (PyroModule[nn.Conv*d] with a PyroSample bias): the
    convolution runs with the plain kernel and the drawn bias, without a warning."""
    kernel = conv + "_dense"
    w_loc, _, x = KERNELS[kernel]
    fn = getattr(F, conv)
    with local_reparameterization(strict=True):
        _, b, _ = _sites(kernel, 0.5)
        out = fn(x, w_loc, b, padding=1)
    torch.testing.assert_close(out, fn(x, w_loc, plain(b), padding=1))


def test_a_transposed_matrix_used_as_a_kernel_warns_and_uses_the_draw():
    """A kernel that is the transpose of a matrix site (``w.mT`` of a plate of (in, k)
    matrices) has no convolution rule: the drawn values are used and the use is reported."""
    x = torch.randn(2, 1, 5, generator=torch.Generator().manual_seed(1))
    loc = torch.randn(3, 2, 1, generator=torch.Generator().manual_seed(2))

    def model():
        with pyro.plate("out", 3):
            w = pyro.sample("w", dist.Normal(loc, 0.5).to_event(2))  # (3, 2, 1), event dim 2
            return F.conv1d(x, w.mT), plain(w)

    # reported as the op the user called (the generic path), not as a kernel of the wrong rank
    with pytest.warns(LocalReparameterizationWarning, match=r"'w' is used by torch\.conv1d, which"):
        with local_reparameterization():
            out, w = model()
    torch.testing.assert_close(out, F.conv1d(x, w.mT))
    with pytest.raises(NotImplementedError, match=r"'w' is used by torch\.conv1d, which"):
        with local_reparameterization(strict=True):
            model()

"""Bayesian Linear and convolution layers whose weights are Pyro sample sites."""

import math

import torch
from pyro.nn import PyroModule, PyroSample
from pyro.poutine.messenger import block_messengers
from pyro.poutine.plate_messenger import PlateMessenger
from pyro.poutine.runtime import get_plates

from .._broadcast import ntuple
from .._checks import positive_int
from .functional import ConvSpec, LinearSpec, align_to_frames, bayesian_layer
from .guided_value import plain
from .priors import (
    HyperPrior,
    LearnedPrior,
    PriorSpec,
    hierarchical_prior,
    hyper_site_prior,
    make_prior,
    scaled_normal,
)

__all__ = ["BayesianLinear", "BayesianConv1d", "BayesianConv2d"]


def _align_to_plates(value, event_ndim):
    """:func:`~pyro_dropout.nn.functional.align_to_frames` for the enclosing plates."""
    # a guided value's reshape would count as a use without a rule: work on the plain tensor
    return align_to_frames(plain(value), event_ndim, get_plates())


def _is_subsampled_plate(messenger):
    return (
        isinstance(messenger, PlateMessenger)
        and messenger.subsample_size is not None
        and 0 < messenger.subsample_size < messenger.size
    )


class _SitePrior:
    """The prior of a layer's ``weight`` or ``bias`` site, as :class:`~pyro.nn.PyroSample`
    calls it (``prior(layer)``). A module-level class, not a lambda, so that the layer pickles
    (``torch.save(model)``): a lambda defined in a method is a local object that :mod:`pickle`
    cannot name, and PyroSample renames a plain function's ``__name__`` in place (so pickle would
    not find that either); an instance has no ``__name__`` to rename."""

    def __init__(self, what):
        self.what = what

    def __call__(self, layer):
        return layer._site_prior(self.what)


class _HyperSitePrior(_SitePrior):
    """The prior of the scale/precision site of a hierarchical prior (picklable, as
    :class:`_SitePrior`)."""

    def __call__(self, layer):
        return layer._hyper_prior(self.what)


class _BayesianLayer(PyroModule):
    """Shared machinery: ``weight`` and ``bias`` are :class:`~pyro.nn.PyroSample` sites."""

    def _setup_sites(self, weight_shape, bias_shape, prior, bias_prior):
        self.weight_shape = torch.Size(weight_shape)
        self.bias_shape = None if bias_shape is None else torch.Size(bias_shape)
        self.prior = hierarchical_prior(prior) or prior
        if bias_prior is None:
            # A learned scale (or precision) for the biases only on request: biases start at
            # exactly 0, and for a guide with a small fixed posterior SD σ (MC dropout's slab)
            # the fitted scale of an all-zero group is σ itself, whose weight decay 1/σ² then
            # holds the biases at 0 (measured: the whole network collapsed to a constant).
            bias_prior = None if hierarchical_prior(prior) is not None else prior
        self.bias_prior = hierarchical_prior(bias_prior) or bias_prior
        # Empty buffer: follows .to(device) so priors are built on the layer's device.
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)
        self._hyper_site(self.prior, "weight", self.weight_shape)
        self.weight = PyroSample(_SitePrior("weight"))
        if bias_shape is None:
            self.bias = None
        else:
            self._hyper_site(self.bias_prior, "bias", self.bias_shape)
            self.bias = PyroSample(_SitePrior("bias"))

    def _hyper_site(self, spec, what, shape):
        """The site of a learned prior scale (``<what>_prior_scale``) or of a Gamma-distributed
        prior precision (``<what>_prior_precision``)."""
        if isinstance(spec, LearnedPrior):
            attr = f"{what}_prior_scale"
        elif isinstance(spec, HyperPrior):
            attr = f"{what}_prior_precision"
        else:
            return
        setattr(self, attr, PyroSample(_HyperSitePrior(what)))

    def _site_prior(self, what):
        """The prior of the ``weight`` or ``bias`` site."""
        if what == "weight":
            return self._prior(self.prior, self.weight_shape, "weight")
        return self._prior(self.bias_prior, self.bias_shape, "bias")

    def _hyper_prior(self, what):
        """The prior of the scale (or precision) site of the ``weight`` or ``bias`` prior."""
        spec, shape = (
            (self.prior, self.weight_shape)
            if what == "weight"
            else (self.bias_prior, self.bias_shape)
        )
        return hyper_site_prior(
            spec, self._pyro_get_fullname(what), shape, self._anchor.dtype, self._anchor.device
        )

    def _prior(self, prior, shape, what=None):
        if isinstance(prior, LearnedPrior | HyperPrior):
            if isinstance(prior, LearnedPrior):
                scale = getattr(self, f"{what}_prior_scale")
            else:
                scale = getattr(self, f"{what}_prior_precision").rsqrt()
            return scaled_normal(scale, prior, shape)
        return make_prior(prior, shape, self._anchor.device, self._anchor.dtype)

    @property
    def fan_in(self):
        return math.prod(self.weight_shape[1:])

    def forward(self, x):
        with block_messengers(_is_subsampled_plate):
            # Weights are global: drawn outside any subsampled (data) plate the layer is
            # called in, where they would otherwise become one weight per row.
            weight, bias = self.weight, self.bias
        weight = _align_to_plates(weight, len(self.weight_shape))
        if bias is not None:
            bias = _align_to_plates(bias, 1)
        bias_name = None if bias is None else self._pyro_get_fullname("bias")
        return bayesian_layer(
            x,
            weight,
            bias,
            spec=self.spec,
            bias_name=bias_name,
            name=self._pyro_get_fullname("weight"),
        )


class BayesianLinear(_BayesianLayer):
    r"""A Linear layer with random weight ``(out, in)`` and bias ``(out,)``.

    The forward pass broadcasts over leading sample/particle dimensions of the weights
    (batched matmul), so ``Predictive(parallel=True)`` and
    ``TraceMeanField_ELBO(vectorize_particles=True)`` work; under
    :func:`~pyro_dropout.local_reparameterization` it samples pre-activations instead.

    :param prior: prior on the weights: ``None``/a number ``s`` (``Normal(0, s)``, default 1), a
        scalar distribution such as ``ImproperLogUniform()``, or a callable ``shape -> dist``.
    :param bias_prior: prior on the bias (defaults to ``prior``; to ``Normal(0, 1)`` when
        ``prior`` is ``"learned"``/``"hyper"``, which a bias takes only when asked).

    Example::

        layer = BayesianLinear(3, 2, prior=0.5)
        y = layer(torch.randn(10, 3))   # samples weight and bias from the prior
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        prior: PriorSpec = None,
        bias_prior: PriorSpec = None,
    ) -> None:
        super().__init__()
        in_features = positive_int(in_features, "in_features")
        out_features = positive_int(out_features, "out_features")
        self.in_features = in_features
        self.out_features = out_features
        self.spec = LinearSpec()
        self._setup_sites(
            (out_features, in_features), (out_features,) if bias else None, prior, bias_prior
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class _BayesianConvNd(_BayesianLayer):
    _ndim = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = True,
        prior: PriorSpec = None,
        bias_prior: PriorSpec = None,
    ) -> None:
        super().__init__()
        in_channels = positive_int(in_channels, "in_channels")
        out_channels = positive_int(out_channels, "out_channels")
        groups = positive_int(groups, "groups")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                f"divisible by groups ({groups})"
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = ntuple(kernel_size, self._ndim)
        padding = padding if isinstance(padding, str) else ntuple(padding, self._ndim)
        self.spec = ConvSpec(
            self._ndim, ntuple(stride, self._ndim), padding, ntuple(dilation, self._ndim), groups
        )
        self._setup_sites(
            (out_channels, in_channels // groups) + self.kernel_size,
            (out_channels,) if bias else None,
            prior,
            bias_prior,
        )

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={s.stride}, padding={s.padding}, dilation={s.dilation}, groups={s.groups}"
        )


class BayesianConv1d(_BayesianConvNd):
    """A 1-d convolution with random kernel ``(out, in/groups, k)``; see :class:`BayesianConv2d`."""

    _ndim = 1


class BayesianConv2d(_BayesianConvNd):
    """A 2-d convolution with random kernel ``(out, in/groups, kh, kw)`` and bias ``(out,)``.

    Leading sample dimensions of the kernel are applied as one grouped convolution. Arguments
    follow :class:`torch.nn.Conv2d` (zero padding only), plus ``prior`` and ``bias_prior`` as in
    :class:`BayesianLinear`.

    Example::

        conv = BayesianConv2d(1, 4, kernel_size=3, padding=1)
        y = conv(torch.randn(8, 1, 28, 28))   # (8, 4, 28, 28)
    """

    _ndim = 2

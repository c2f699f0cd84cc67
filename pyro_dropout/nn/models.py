"""Bayesian network models: a network of Bayesian layers plus a likelihood, as one Pyro model."""

import inspect
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal

import pyro
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule

from .._checks import positive_int
from .layers import BayesianConv2d, BayesianLinear
from .likelihoods import (
    CategoricalLikelihood,
    GaussianLikelihood,
    HeteroscedasticGaussianLikelihood,
)
from .priors import PriorSpec

__all__ = ["BayesianModel", "BayesianMLP", "BayesianConvNet", "make_likelihood"]


def _identity(h):
    """The identity activation (a named function, unlike a lambda, pickles with the model)."""
    return h


_ACTIVATIONS = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "elu": F.elu,
    "gelu": F.gelu,
    "identity": _identity,
}


def _widths(hidden: Any) -> tuple[int, ...]:  # validates any user input
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        hidden = (hidden,)
    try:
        hidden = tuple(hidden)
    except TypeError:
        raise ValueError(f"hidden must be a sequence of layer widths, got {hidden!r}") from None
    return tuple(positive_int(h, f"hidden[{i}]") for i, h in enumerate(hidden))


def _activation(activation):
    if callable(activation):
        return activation
    try:
        return _ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(
            f"unknown activation {activation!r}; use one of {sorted(_ACTIVATIONS)} or a callable"
        ) from None


def make_likelihood(
    likelihood: str | torch.nn.Module,
    tau: float | None = None,
    init_noise_scale: float = 1.0,
) -> Any:  # a likelihood module: ``distribution(f)``, ``check_target(y, f)``, ...
    """``"regression"`` (Gaussian; fixed precision ``tau`` or a latent noise scale when
    ``tau is None``), ``"heteroscedastic"`` (Gaussian with an input-dependent scale predicted
    by the network, :class:`HeteroscedasticGaussianLikelihood`; ``init_noise_scale`` is its
    scale at zero output), ``"classification"`` (categorical), or a likelihood module (with
    ``distribution(f)`` and ``check_target(y, f)``)."""
    if isinstance(likelihood, torch.nn.Module):
        if not (hasattr(likelihood, "distribution") and hasattr(likelihood, "check_target")):
            raise TypeError(
                f"likelihood module {type(likelihood).__name__} needs distribution(f) and "
                "check_target(y, f) methods (see pyro_dropout.nn.GaussianLikelihood)"
            )
        return likelihood
    if likelihood in ("regression", "gaussian"):
        return GaussianLikelihood(tau=tau, init_noise_scale=init_noise_scale)
    if likelihood == "heteroscedastic":
        if tau is not None:
            raise ValueError(
                "tau is the precision of a homoscedastic likelihood; the heteroscedastic one "
                "predicts its noise scale per input"
            )
        return HeteroscedasticGaussianLikelihood(init_scale=init_noise_scale)
    if likelihood in ("classification", "categorical"):
        if tau is not None:
            raise ValueError("tau is a regression setting; classification has no noise precision")
        _ = init_noise_scale
        return CategoricalLikelihood()
    raise ValueError(
        "likelihood must be 'regression', 'heteroscedastic', 'classification' or a module, "
        f"got {likelihood!r}"
    )


class BayesianModel(PyroModule):
    r"""A Pyro model ``model(x, y=None, num_data=None)`` from a network and a likelihood.

    The network (Bayesian layers, or any module whose random weights are Pyro sample sites)
    maps ``x`` to outputs ``f`` of shape ``(..., N, out)``; the likelihood observes ``y`` at
    site ``"obs"`` inside ``pyro.plate("data", num_data, dim=-1)``. With minibatches pass
    ``num_data`` = the full data size: the plate then scales the likelihood by ``N/B`` so one
    pass over the data counts the KL once (the mis-scaling most often reported in BNN
    libraries). Returns ``f``.

    Example::

        net = bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 20), torch.nn.ReLU(),
                                              torch.nn.Linear(20, 1)))
        model = BayesianModel(net, likelihood="regression", tau=10.0)
    """

    max_plate_nesting = 1

    def __init__(
        self,
        net: Callable[[torch.Tensor], torch.Tensor],
        likelihood: Literal["regression", "heteroscedastic", "classification"]
        | torch.nn.Module = "regression",
        tau: float | None = None,
        init_noise_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.net = net
        self.likelihood = make_likelihood(likelihood, tau, init_noise_scale)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor | None = None, num_data: int | None = None
    ) -> torch.Tensor:
        f = self.net(x)
        n = f.shape[-2]
        size = n if num_data is None else int(num_data)
        if size < n:
            raise ValueError(f"num_data ({size}) is smaller than the minibatch ({n})")
        subsample = None if size == n else torch.arange(n, device=f.device)
        # Global latents of the likelihood (a learned noise scale) are drawn here, outside
        # the data plate: inside it they would be one per row.
        fn = self.likelihood.distribution(f)
        y = self.likelihood.check_target(y, f)
        with pyro.plate("data", size, subsample=subsample, dim=-1):
            pyro.sample("obs", fn, obs=y)
        return f

    @property
    def accepts_num_data(self) -> bool:
        return "num_data" in inspect.signature(self.forward).parameters


class BayesianMLP(BayesianModel):
    r"""A fully connected Bayesian network with a likelihood.

    :param int in_features: input dimension.
    :param int out_features: output dimension (classes for classification).
    :param hidden: hidden layer widths, e.g. ``(50,)`` (Gal's UCI net) or ``(400, 400)``.
    :param activation: ``"relu"``, ``"tanh"``, ... or a callable.
    :param likelihood: ``"regression"``, ``"heteroscedastic"`` (the last layer has
        ``2 * out_features`` outputs: mean and noise scale of each target, see
        :class:`HeteroscedasticGaussianLikelihood`), ``"classification"`` or a likelihood
        module (with ``outputs_per_target`` network outputs per target, default 1).
    :param float tau: fixed noise precision for regression; ``None`` learns a noise scale.
    :param prior: weight prior (see :class:`BayesianLinear`), default ``Normal(0, 1)``;
        ``"learned"`` (:class:`~pyro_dropout.nn.LearnedPrior`: the scale fitted to the data)
        or ``"hyper"`` (:class:`~pyro_dropout.nn.HyperPrior`: a Gamma hyperprior on the
        precision).

    Example::

        model = BayesianMLP(8, 1, hidden=(50,), tau=10.0, prior=1.0)
        guide = AutoDropout(model, dropout_rate=0.05)
        losses = fit(model, guide, x, y, num_epochs=100, batch_size=128)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden: int | Sequence[int] = (50,),
        activation: str | Callable[[torch.Tensor], torch.Tensor] = "relu",
        likelihood: Literal["regression", "heteroscedastic", "classification"]
        | torch.nn.Module = "regression",
        tau: float | None = None,
        prior: PriorSpec = None,
        bias_prior: PriorSpec = None,
        init_noise_scale: float = 1.0,
    ) -> None:
        in_features = positive_int(in_features, "in_features")
        out_features = positive_int(out_features, "out_features")
        hidden = _widths(hidden)
        likelihood = make_likelihood(likelihood, tau, init_noise_scale)
        per_target = getattr(likelihood, "outputs_per_target", 1)
        widths = (in_features,) + hidden + (out_features * per_target,)
        layers = PyroModule[torch.nn.ModuleList](
            [
                BayesianLinear(a, b, prior=prior, bias_prior=bias_prior)
                for a, b in zip(widths[:-1], widths[1:], strict=True)
            ]
        )
        super().__init__(_MLPNet(layers, _activation(activation)), likelihood)
        self.activation = activation


class _MLPNet(PyroModule):
    def __init__(self, layers, activation):
        super().__init__()
        self.layers = layers
        self.activation = activation

    def forward(self, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h


def _pool(h, k=2):
    # max_pool2d takes (N, C, H, W) only: fold the sample/particle dims into N.
    lead = h.shape[:-3]
    out = F.max_pool2d(h.reshape((-1,) + h.shape[-3:]), k)
    return out.reshape(lead + out.shape[-3:])


class _LeNet(PyroModule):
    def __init__(self, in_channels, num_classes, image_size, channels, hidden, kernel_size, prior):
        super().__init__()
        in_channels = positive_int(in_channels, "in_channels")
        num_classes = positive_int(num_classes, "num_classes")
        image_size = positive_int(image_size, "image_size")
        hidden = positive_int(hidden, "hidden")
        kernel_size = positive_int(kernel_size, "kernel_size")
        channels = _widths(channels)
        if len(channels) != 2:
            raise ValueError(f"channels must hold two widths (conv1, conv2), got {channels!r}")
        c1, c2 = channels
        self.conv1 = BayesianConv2d(in_channels, c1, kernel_size, prior=prior)
        self.conv2 = BayesianConv2d(c1, c2, kernel_size, prior=prior)
        side = ((image_size - kernel_size + 1) // 2 - kernel_size + 1) // 2
        if side < 1:
            raise ValueError(f"image_size {image_size} is too small for two conv+pool blocks")
        self.fc1 = BayesianLinear(c2 * side * side, hidden, prior=prior)
        self.fc2 = BayesianLinear(hidden, num_classes, prior=prior)

    def forward(self, x):
        h = _pool(torch.relu(self.conv1(x)))
        h = _pool(torch.relu(self.conv2(h)))
        h = torch.relu(self.fc1(h.flatten(-3)))
        return self.fc2(h)


class BayesianConvNet(BayesianModel):
    r"""A small LeNet-style Bayesian CNN (Gal & Ghahramani's "LeNet-all" layout):
    conv(5×5, 20) – ReLU – max-pool – conv(5×5, 50) – ReLU – max-pool – FC 500 – ReLU – FC.

    With :class:`~pyro_dropout.AutoDropout` every Bayesian layer but the first drops its input,
    i.e. dropout after every convolution, and MC averaging at test time gives Gal's Bayesian
    CNN; the first convolution reads the image, whose channels are dropped only if asked
    (``input_dropout_rate``: with one input channel a dropped channel is a blank image).

    Inputs have shape ``(..., N, in_channels, image_size, image_size)``.

    Example::

        model = BayesianConvNet(in_channels=1, num_classes=10, image_size=28)
        guide = AutoDropout(model, dropout_rate=0.5)
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        image_size: int = 28,
        channels: Sequence[int] = (20, 50),
        hidden: int = 500,
        kernel_size: int = 5,
        prior: PriorSpec = None,
        likelihood: Literal["regression", "heteroscedastic", "classification"]
        | torch.nn.Module = "classification",
        tau: float | None = None,
    ) -> None:
        net = _LeNet(in_channels, num_classes, image_size, channels, hidden, kernel_size, prior)
        super().__init__(net, likelihood, tau)

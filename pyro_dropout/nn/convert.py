"""Turning a deterministic ``torch.nn.Module`` into its Bayesian twin."""

import copy
from collections.abc import Iterable

import torch
from pyro.nn.module import PyroModule, to_pyro_module_

from .layers import BayesianConv1d, BayesianConv2d, BayesianLinear
from .priors import PriorSpec

__all__ = ["bayesianize"]

_CONVERTIBLE = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
#: torch.nn's dropout layers (the subclasses of their private base, ``_DropoutNd``, in torch 2.13)
_DROPOUT_LAYERS = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


def _convert_layer(m, prior, bias_prior):
    if type(m) is torch.nn.Linear:
        new = BayesianLinear(
            m.in_features, m.out_features, m.bias is not None, prior=prior, bias_prior=bias_prior
        )
    else:
        if m.padding_mode != "zeros":
            raise ValueError(
                f"bayesianize: {type(m).__name__} with padding_mode={m.padding_mode!r} is not "
                "supported (zero padding only)"
            )
        cls = BayesianConv1d if type(m) is torch.nn.Conv1d else BayesianConv2d
        new = cls(
            m.in_channels,
            m.out_channels,
            m.kernel_size,
            stride=m.stride,
            padding=m.padding,
            dilation=m.dilation,
            groups=m.groups,
            bias=m.bias is not None,
            prior=prior,
            bias_prior=bias_prior,
        )
    return new.to(device=m.weight.device, dtype=m.weight.dtype)


def bayesianize(
    module: torch.nn.Module,
    prior: PriorSpec = None,
    bias_prior: PriorSpec = None,
    deterministic: Iterable[type[torch.nn.Module]] = (),
    keep_dropout: bool = False,
) -> PyroModule:
    """Return a Bayesian twin of ``module``: every ``nn.Linear``, ``nn.Conv1d`` and
    ``nn.Conv2d`` becomes a :class:`BayesianLinear` / :class:`BayesianConv1d` /
    :class:`BayesianConv2d` (weights and biases are Pyro sample sites with ``prior``); other
    modules stay deterministic.

    The input module is not modified (it is deep-copied). Parameter-free modules (activations,
    pooling, flatten) are kept; ``nn.Dropout`` layers are replaced by ``nn.Identity`` unless
    ``keep_dropout`` (the dropout guide supplies dropout as inference). Modules with parameters
    of any other type raise a ``TypeError`` naming them, unless their types are listed in
    ``deterministic`` (their parameters then become Pyro params: point estimates). Subclasses of
    the convertible layers count as "another type" (their ``forward`` may differ).

    Limitation: kept modules are used as they are, so they see the extra leading sample
    dimension of vectorised prediction (``predict``, ``Predictive(parallel=True)``,
    ``vectorize_particles``) only if they broadcast over it; ``nn.MaxPool2d`` and
    ``nn.Flatten(start_dim=1)`` do not. Such networks fit with sequential particles; for
    vectorised CNN prediction use :class:`BayesianConvNet` or write the forward with
    broadcasting ops.

    Example::

        net = torch.nn.Sequential(torch.nn.Linear(8, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))
        model = BayesianModel(bayesianize(net, prior=1.0), likelihood="regression", tau=10.0)
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"bayesianize: module must be a torch.nn.Module (a network to convert); got "
            f"{type(module).__name__}"
        )
    deterministic = tuple(deterministic)
    bad = sorted(
        {
            f"{name or '<root>'} ({type(m).__name__})"
            for name, m in module.named_modules()
            if type(m) not in _CONVERTIBLE  # subclasses may change forward: not converted
            and not isinstance(m, deterministic)
            and any(True for _ in m.parameters(recurse=False))
        }
    )
    if bad:
        raise TypeError(
            "bayesianize can convert nn.Linear, nn.Conv1d and nn.Conv2d (exact types); these "
            "layers have "
            f"parameters of another type: {', '.join(bad)}. Pass their types in "
            "deterministic=(...) to keep them as point estimates."
        )
    module = copy.deepcopy(module)
    if type(module) in _CONVERTIBLE:
        return _convert_layer(module, prior, bias_prior)
    _replace(module, prior, bias_prior, keep_dropout)
    to_pyro_module_(module)
    return module


def _replace(module, prior, bias_prior, keep_dropout):
    for name, child in list(module.named_children()):
        if type(child) in _CONVERTIBLE:
            setattr(module, name, _convert_layer(child, prior, bias_prior))
        elif isinstance(child, _DROPOUT_LAYERS) and not keep_dropout:
            setattr(module, name, torch.nn.Identity())
        elif not isinstance(child, PyroModule):
            _replace(child, prior, bias_prior, keep_dropout)

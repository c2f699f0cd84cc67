"""Linear and convolution maps that broadcast over leading sample dimensions of the weights.

``F.linear`` rejects a weight with a leading sample dimension, which is why
``Predictive(parallel=True)`` and ``vectorize_particles=True`` fail on ``PyroModule[nn.Linear]``
networks. Here a weight of shape ``W_batch + (out, in)`` is broadcast against an input of shape
``x_batch + (in,)`` exactly like any other batched tensor in Pyro: the weight's batch dims align
with the input's batch dims from the right. Trailing size-1 weight dims (the data-plate slots)
are folded into the rows of one matrix product, so a batch of weights costs one batched matmul
(or one grouped convolution), never a per-example loop.

The layers call :func:`bayesian_layer`, a Pyro *effectful* operation: by default it applies the
sampled weights, and :class:`~pyro_dropout.handlers.LocalReparameterizationMessenger`
intercepts it to sample pre-activations instead.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

from .._broadcast import broadcast_shape, unexpand

__all__ = ["LinearSpec", "ConvSpec", "add_bias", "bayesian_layer", "token_layout", "unexpand"]


def _unexpand_batch(t, event_dim):
    """:func:`unexpand` on the batch dims only: the event dims keep their sizes (a prior such
    as ``Normal(0., 1.).expand(shape)`` has a fully broadcast ``loc``)."""
    u = unexpand(t)
    return u.expand(u.shape[: u.dim() - event_dim] + t.shape[t.dim() - event_dim :])


def _split_batch(x_batch, w_batch):
    """How many trailing input batch dims the weight does not vary over (its "row" dims)."""
    rows = 0
    for i in range(1, len(x_batch) + 1):
        if i <= len(w_batch) and w_batch[-i] != 1:
            break
        rows += 1
    return rows


def token_layout(x, weight, spec):
    """``(example_size, token_shape)`` of a Linear layer's input ``x`` against its ``weight``.

    The batch dims of ``x`` (all but the features) that the weight does not vary over are the
    rows of one matrix product (:func:`_split_batch`, aligned from the right as torch
    broadcasts); the dims to their left are sample dims (one weight draw each). Of the rows,
    the first is the example axis and the others, if any, are token dims: one example's
    tokens (a sequence, a set) all meet the same weight under q. This is the layout torch
    gives ``nn.Linear`` (``(*, H_in)``, batch first) and the library's convention for
    convolutions (the example axis leads, ``N`` of ``(N, C, H, W)``). ``token_shape`` is
    ``()`` for an input ``(B, d)`` (or ``(S, B, d)`` with a weight drawn per sample ``S``).
    """
    weight = unexpand(weight)
    event = 1 if spec.vector else 2
    w_batch = weight.shape[: max(weight.dim() - event, 0)]
    x_batch = x.shape[:-1]
    rows = _split_batch(x_batch, w_batch)
    if rows < 2:
        return (x_batch[-1] if rows else None), ()
    first = len(x_batch) - rows
    return x_batch[first], x_batch[first + 1 :]


@dataclass(frozen=True)
class LinearSpec:
    """``y = x Wᵀ (+ b)`` with broadcasting over batch dims of ``W`` and ``x``.

    :param bool transposed: the weight is stored ``(in, out)`` and the product is ``x W``
        (a functional model's ``x @ w``); default ``(out, in)`` as ``torch.nn.Linear``.
    :param bool vector: the weight is a vector ``(in,)`` and ``y = x · w`` has no output dim.
    :param int tokens: how many input dims between the example axis and the features one
        weight draw serves (an input ``(B, T, d)``: 1; a set or a sequence of ``T`` tokens per
        example). The product is the same; the local-reparameterisation rules read it to draw
        their noise and masks once per example, shared over these dims
        (:func:`token_layout`).
    """

    transposed: bool = False
    vector: bool = False
    tokens: int = 0

    @property
    def feature_dims(self) -> int:
        """Trailing output dims per example (none for a vector weight)."""
        return 0 if self.vector else 1

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.vector:
            out = LinearSpec(transposed=True)(x, weight.unsqueeze(-1))
            out = out.squeeze(-1)
            return out if bias is None else out + bias
        weight = _unexpand_batch(weight, 2)
        if self.transposed:
            weight = weight.transpose(-1, -2)
        event = weight.shape[-2:]
        w_batch = weight.shape[:-2]
        if bias is not None:
            bias = unexpand(bias)
        x_batch = x.shape[:-1]
        rows = _split_batch(x_batch, w_batch)
        w_lead = w_batch[: max(len(w_batch) - rows, 0)]
        if all(n == 1 for n in w_lead):
            # One weight matrix for every row: a plain GEMM.
            w2 = weight.reshape(event)
            if bias is not None and bias.shape[:-1].numel() != 1:
                return F.linear(x, w2) + bias  # a batch of biases: broadcast after the GEMM
            b2 = None if bias is None else bias.reshape(bias.shape[-1:])
            return F.linear(x, w2, b2)
        x_lead, row_shape = x_batch[: len(x_batch) - rows], x_batch[len(x_batch) - rows :]
        x2 = x.reshape(x_lead + (math.prod(row_shape), x.shape[-1]))
        w2 = weight.reshape(w_lead + event)
        out = torch.matmul(x2, w2.transpose(-1, -2))
        out = out.reshape(out.shape[:-2] + row_shape + out.shape[-1:])
        if bias is not None:
            out = out + bias
        return out


@dataclass(frozen=True)
class ConvSpec:
    """N-d convolution (``N`` = 1 or 2) broadcasting over batch dims of the kernel and input.

    A batch of ``G`` kernels is applied as one grouped convolution with ``G * groups`` groups.
    """

    ndim: int = 2
    stride: tuple = (1, 1)
    padding: tuple | str = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1

    @property
    def feature_dims(self) -> int:
        return 1 + self.ndim

    def _conv(self, x, weight, bias, groups):
        fn = F.conv1d if self.ndim == 1 else F.conv2d
        return fn(x, weight, bias, self.stride, self.padding, self.dilation, groups)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        nd = self.ndim
        weight = _unexpand_batch(weight, 2 + nd)
        kernel_event = weight.shape[-(2 + nd) :]
        w_batch = weight.shape[: -(2 + nd)]
        x_event = x.shape[-(1 + nd) :]
        x_batch = x.shape[: -(1 + nd)]
        rows = _split_batch(x_batch, w_batch)
        w_lead = w_batch[: max(len(w_batch) - rows, 0)]
        x_lead, row_shape = x_batch[: len(x_batch) - rows], x_batch[len(x_batch) - rows :]
        num_rows = math.prod(row_shape)
        lead = broadcast_shape(x_lead, w_lead)
        g = math.prod(lead)
        out_channels = kernel_event[0]
        if g == 1:
            x2 = x.reshape((num_rows,) + x_event)
            out = self._conv(x2, weight.reshape(kernel_event), None, self.groups)
            return out.reshape(lead + row_shape + out.shape[1:])
        # Fold the G lead positions into channels: (rows, G*C, *spatial) with G*groups groups.
        x2 = x.expand(lead + row_shape + x_event).reshape((g, num_rows) + x_event)
        x2 = x2.transpose(0, 1).reshape((num_rows, g * x_event[0]) + x_event[1:])
        w2 = weight.reshape(w_lead + kernel_event).expand(lead + kernel_event)
        w2 = w2.reshape((g * out_channels,) + kernel_event[1:])
        out = self._conv(x2, w2, None, g * self.groups)
        spatial = out.shape[2:]
        out = out.reshape((num_rows, g, out_channels) + spatial).transpose(0, 1)
        return out.reshape(lead + row_shape + (out_channels,) + spatial)


def align_to_frames(value, event_ndim, frames):
    """Lay a value's batch dims out along the given plate frames' dims.

    ``Predictive(parallel=True)`` hands the model samples shaped ``(S,) + event_shape``
    although its vectorising plate sits at ``dim=-max_plate_nesting-1`` (it pads by plate depth,
    not by event dims); a weight of shape ``(S, out, in)`` would then broadcast against the data
    dimension. When the batch holds exactly the plates' sizes, reshape it to their layout, e.g.
    ``(S,) -> (S, 1)`` for a plate at dim -2.
    """
    batch = value.shape[: value.dim() - event_ndim]
    if not batch:
        return value
    frames = [f for f in frames if f.vectorized and f.dim is not None]
    if not frames:
        return value
    target = [1] * max(-f.dim for f in frames)
    for f in frames:
        target[f.dim] = f.size
    target = torch.Size(target)
    if batch == target or len(batch) >= len(target) or batch.numel() != target.numel():
        return value
    return value.reshape(target + value.shape[len(batch) :])


def add_bias(out, bias, spec):
    """Add a bias of shape ``batch + (out,)`` to a layer output (broadcast over spatial dims)."""
    if bias is None:
        return out
    if isinstance(spec, ConvSpec):
        bias = bias[(...,) + (None,) * spec.ndim]
    return out + bias


def check_linear_input(x, weight, spec, name=None):
    """A ``ValueError`` naming the weight site and the sizes when the input's last dim does
    not match the weight's input dim (torch would say "mat1 and mat2 shapes cannot be
    multiplied", naming neither the input nor the layer)."""
    if not isinstance(spec, LinearSpec) or spec.vector or weight.dim() < 2 or x.dim() < 1:
        return
    width = weight.shape[-2] if spec.transposed else weight.shape[-1]
    if x.shape[-1] != width:
        site = f"weight site {name!r}" if name is not None else "a linear layer"
        raise ValueError(
            f"the input of {site} has {x.shape[-1]} features (shape {tuple(x.shape)}), but "
            f"the weight takes {width}: check the number of columns of x (the model's inputs) "
            "against the layer the model was built with"
        )


def _apply_layer(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    spec: "LinearSpec | ConvSpec",
    bias_name: str | None = None,
) -> torch.Tensor:
    check_linear_input(x, weight, spec)
    if isinstance(spec, LinearSpec):
        return spec(x, weight, bias)
    return add_bias(spec(x, weight), bias, spec)


#: Effectful layer application. ``name`` is the weight's sample-site name, ``bias_name`` the
#: bias's (or None); handlers dispatch on message type ``"bayesian_layer"``.
bayesian_layer = effectful(_apply_layer, type="bayesian_layer")

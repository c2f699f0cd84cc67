"""Linear and convolution maps that broadcast over leading sample dimensions of the weights.

``F.linear`` rejects a weight with a leading sample dimension, which is why
``Predictive(parallel=True)`` and ``vectorize_particles=True`` fail on ``PyroModule[nn.Linear]``
networks. Here a weight of shape ``W_batch + (out, in)`` is broadcast against an input of shape
``x_batch + (in,)`` exactly like any other batched tensor in Pyro: the weight's batch dims align
with the input's batch dims from the right. Trailing size-1 weight dims (the data-plate slots)
are folded into the rows of one matrix product, so a batch of weights costs one batched matmul
(or one grouped convolution), never a per-example loop. A Linear input may carry token dims
between its example axis and its features (``(N, L, d)``: a sequence or a set per example);
they are rows too, and the weight's batch dims skip them (:func:`read_rows`).

The layers call :func:`bayesian_layer`, a Pyro *effectful* operation: by default it applies the
sampled weights, and :class:`~pyro_dropout.handlers.LocalReparameterizationMessenger`
intercepts it to sample pre-activations instead.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

from .._broadcast import broadcast_shape, unexpand

__all__ = [
    "LayoutError",
    "LinearSpec",
    "ConvSpec",
    "add_bias",
    "apply_spec",
    "bayesian_layer",
    "read_rows",
    "token_layout",
    "unexpand",
]


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


class LayoutError(ValueError):
    """A Linear input's batch dims cannot be read against its weight's draws (the message
    gives both shapes; the handlers add the weight site's name)."""


def _broadcasts(a, b):
    try:
        broadcast_shape(a, b)
    except RuntimeError:
        return False
    return True


def read_rows(x_batch, w_batch, tokens=None, draws=None):
    """``(t, rows)``: how an input's batch dims ``x_batch`` meet a weight's ``w_batch``.

    The input is read as ``x_batch = lead + data + T`` with ``t = len(T)`` token dims: the
    weight's batch dims align from the right with ``lead + data`` (as Pyro broadcasts), the
    ``data`` dims are those the weight does not vary over (its trailing size-1 dims, or none
    of its dims), and ``lead`` broadcasts against the weight's remaining (sample) dims. The
    ``rows = len(data) + t`` trailing dims of ``x_batch`` are the rows of one matrix product
    per ``lead`` position: each weight draw meets all the rows (examples and their tokens) of
    its own lead position, or of every position when the input has no sample dims.

    ``tokens`` given: that reading, or a :class:`LayoutError` when it does not broadcast.
    Else the fewest token dims that broadcast, i.e. Pyro's rule (``t = 0``) wherever it
    applies (the local-reparameterisation rules lay their per-example draws out that way,
    with size-1 slots for the tokens), else the extra dims between the example axis and the
    features are tokens (a weight drawn ``(S, 1, out, in)`` against an input ``(N, L, d)``
    gives ``(S, N, L, out)``, each draw applied to every token of every example).

    Shapes alone cannot tell ``(S, N, d)`` (an input that already carries ``S`` draws) from
    ``(N, L, d)`` with ``N == S`` (examples of tokens); without more, the first reading is
    taken. ``draws``, when known, is the number of leading dims of ``x_batch`` that carry
    weight draws (0 for the model's data): the reading must then keep every other dim in the
    rows (:class:`~pyro_dropout.handlers.LocalReparameterizationMessenger` knows it from the
    input's rank in a run without draws). If none does, Pyro's reading (``t = 0``) where it
    broadcasts, else a :class:`LayoutError`: the input's draws are not the weight's.
    """
    # Cached by shapes: the reading is pure shape logic (4-10 us of Python a call, measured),
    # and a model's layers meet the same few shapes at every step.
    x_batch, w_batch = tuple(x_batch), tuple(w_batch)
    try:
        return _read_rows(x_batch, w_batch, tokens, draws)
    except TypeError:  # unhashable sizes (symbolic ones, under a tracer): read uncached
        return _read_rows.__wrapped__(x_batch, w_batch, tokens, draws)


@functools.lru_cache(maxsize=512)
def _read_rows(x_batch, w_batch, tokens, draws):
    n = len(x_batch)
    if tokens is not None and not 0 <= tokens <= n:
        raise LayoutError(
            f"an input with batch shape {tuple(x_batch)} has no {tokens} token dims "
            "between its example axis and its features"
        )
    readings = []
    for t in range(n + 1) if tokens is None else (tokens,):
        head = x_batch[: n - t]
        rows = _split_batch(head, w_batch)
        lead = len(head) - rows
        if _broadcasts(head[:lead], w_batch[: max(len(w_batch) - rows, 0)]):
            readings.append((t, t + rows))
            if draws is None or (lead <= draws and all(k == 1 for k in x_batch[lead:draws])):
                return t, t + rows
    if readings and (draws is None or readings[0][0] == 0):
        return readings[0]  # Pyro's own broadcasting (the weight aligned from the right)
    if draws is None:
        raise LayoutError(
            f"weight draws with batch shape {tuple(w_batch)} cannot be applied to an input "
            f"with batch shape {tuple(x_batch)} read as {tokens} token dims: the input's dims "
            f"left of its tokens, {tuple(x_batch[: n - tokens])}, must broadcast against the "
            "weight's batch dims aligned from the right (the weight's sample dims, then its "
            "size-1 slot for the example axis)"
        )
    raise LayoutError(
        f"an input with batch shape {tuple(x_batch)} carries {draws} leading dims of draws "
        f"({tuple(x_batch[:draws])}: it has {draws} more dims than in a run without draws), "
        f"which do not match the weight's draws, batch shape {tuple(w_batch)}: the input's "
        "draws must have the weight's sizes (or 1), with its examples and tokens after them"
    )


def _token_slots(t, tokens, event):
    """``t`` (a bias, batch + ``event`` dims) with ``tokens`` size-1 dims before its event dims,
    so that its batch dims (aligned with the input's examples) skip the token dims."""
    if not tokens or t is None or t.dim() <= event:
        return t
    cut = t.dim() - event
    return t.reshape(t.shape[:cut] + (1,) * tokens + t.shape[cut:])


def token_layout(x, weight, spec):
    """``(example_size, token_shape)`` of a Linear layer's input ``x`` against its ``weight``.

    The batch dims of ``x`` (all but the features) that the weight does not vary over are the
    rows of one matrix product (:func:`read_rows`: aligned from the right as Pyro broadcasts,
    with token dims set aside where that is the only reading that broadcasts); the dims to
    their left are sample dims (one weight draw each). Of the rows,
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
    _, rows = read_rows(x_batch, w_batch)
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
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        token_dims: int | None = None,
    ) -> torch.Tensor:
        """``x Wᵀ + b`` per weight draw; ``token_dims``: how many dims of ``x`` between its
        example axis and its features the weight's batch dims skip (:func:`read_rows`; by
        default read from the shapes)."""
        if self.vector:
            inner = LinearSpec(transposed=True, tokens=self.tokens)
            w = weight.unsqueeze(-1)
            if not torch.is_tensor(bias):  # None or a number: nothing to lay out
                out = inner(x, w, token_dims=token_dims).squeeze(-1)
                return out if bias is None else out + bias
            return inner(x, w, bias.unsqueeze(-1), token_dims).squeeze(-1)
        weight = _unexpand_batch(weight, 2)
        if self.transposed:
            weight = weight.transpose(-1, -2)
        event = weight.shape[-2:]
        w_batch = weight.shape[:-2]
        if bias is not None:
            bias = unexpand(bias)
        x_batch = x.shape[:-1]
        # The layout is read against the batch of the weight and bias together (a bias drawn
        # per sample over a shared weight still has its draws on the left of the examples).
        batch = w_batch
        if bias is not None and bias.dim() > 1 and _broadcasts(w_batch, bias.shape[:-1]):
            batch = broadcast_shape(w_batch, bias.shape[:-1])
        tokens, _ = read_rows(x_batch, batch, token_dims)
        bias = _token_slots(bias, tokens, 1)
        rows = _split_batch(x_batch[: len(x_batch) - tokens], w_batch)
        w_lead = w_batch[: max(len(w_batch) - rows, 0)]
        rows += tokens
        if all(n == 1 for n in w_lead):
            # One weight matrix for every row: a plain GEMM.
            w2 = weight.reshape(event)
            if bias is not None and bias.shape[:-1].numel() != 1:
                return F.linear(x, w2) + bias  # a batch of biases: broadcast after the GEMM
            b2 = None if bias is None else bias.reshape(bias.shape[-1:])
            return F.linear(x, w2, b2)
        # Fold the rows (the examples the weight does not vary over, and their tokens) into
        # one matrix per lead position; the weight's trailing size-1 dims are dropped, so
        # its sample dims meet the input's lead dims (or prepend new ones).
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


def apply_spec(x, weight, bias, spec, token_dims=None):
    """``spec(x, weight)`` plus ``bias``: a Linear layer lays its bias out itself (by the token
    dims given or read from the shapes), a convolution adds it per channel."""
    if isinstance(spec, LinearSpec):
        return spec(x, weight, bias, token_dims)
    return add_bias(spec(x, weight), bias, spec)


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
    return apply_spec(x, weight, bias, spec)


#: Effectful layer application. ``name`` is the weight's sample-site name, ``bias_name`` the
#: bias's (or None); handlers dispatch on message type ``"bayesian_layer"``.
bayesian_layer = effectful(_apply_layer, type="bayesian_layer")

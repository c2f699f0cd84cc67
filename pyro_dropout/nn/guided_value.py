r"""Model-side values of guided weight sites, which route the ops that consume them.

Under :func:`~pyro_dropout.local_reparameterization` the value a model receives at a guided
weight site is a :class:`GuidedValue`: an alias of the drawn tensor (same storage, same autograd
graph) whose ``__torch_function__`` (torch's supported override protocol) sends the operations
that consume it to the messenger that owns it:

* ``F.linear(x, w, b)`` (so ``PyroModule[nn.Linear]``), ``x @ w.T``, ``x @ w``,
  ``torch.matmul`` / ``Tensor.matmul`` / ``torch.mm`` with the weight (or its transpose) on the
  right (a weight vector also on the left, ``w @ x``), and ``F.conv1d`` / ``F.conv2d`` (so
  ``PyroModule[nn.Conv1d/2d]``) are answered by the family's rule (local reparameterisation)
  or, for weight draws, by the same operation broadcast over the weight's sample dimensions;
* ``w.T``, ``w.t()``, ``w.mT``, ``w.transpose(0, 1)``, ``w.permute(1, 0)`` give a
  transposed :class:`GuidedValue`, so the next product still knows the site;
* metadata queries (``shape``, ``dim()``, ``dtype`` ...) pass through;
* every other operation computes on the plain tensors and reports the use to the owner, which
  warns once per weight site (or raises under ``strict=True``): the value there is one weight
  draw shared by the whole minibatch, correct but without the trick.

Why a tensor subclass and not a ``torch.overrides.TorchFunctionMode``: a mode intercepts
*every* torch call inside the context; an eager training step of an 8-50-1 MLP makes 546 of
them, and a pass-through mode added 2.5 ms to a 4.4-5.2 ms step (measured here, one thread).
The subclass costs nothing for operations that do not touch a guided value. Results of every
operation are plain tensors, so nothing downstream is wrapped.
"""

import torch
import torch.nn.functional as F

from .._nested import map_tensors, tensors

__all__ = ["GuidedValue", "SiteRecord", "laid_out", "plain", "wrap"]


class SiteRecord:
    """What a :class:`GuidedValue` knows of its site: the name, the event dims of the value,
    the owning messenger, the trace of the model run that drew it (``None`` if untraced: once
    that trace has left Pyro's stack, the model has returned and uses are the ELBO's log
    densities or stacking of samples; a plate exited inside the model does not count) and the
    plain value in the site's own layout."""

    __slots__ = ("name", "event_dim", "owner", "run", "value")

    def __init__(self, name, event_dim, owner, run, value):
        self.name = name
        self.event_dim = event_dim
        self.owner = owner
        self.run = run
        self.value = value


class GuidedValue(torch.Tensor):
    """An alias of a guided site's value (see the module docs). Attributes: ``_pd_plain`` (the
    plain tensor), ``_pd_site`` (:class:`SiteRecord`), ``_pd_transposed`` (the value is the
    transpose of the site's matrix, from ``w.T`` and friends)."""

    # Set by :func:`wrap` on each instance (declared for type checkers; no class attributes).
    _pd_plain: torch.Tensor
    _pd_site: SiteRecord
    _pd_transposed: bool

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:  # torch's default handling (it returns these unwrapped)
            return super().__torch_function__(func, types, args, kwargs)
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(args, kwargs)
            if out is not NotImplemented:
                return out
        return _fallback(func, args, kwargs)


def wrap(value, site, transposed=False, plain_value=None):
    """A :class:`GuidedValue` aliasing ``value`` (its transpose when ``transposed``)."""
    base = plain(value if plain_value is None else plain_value)
    out = base.as_subclass(GuidedValue)  # of a plain tensor: no __torch_function__ involved
    out._pd_plain = base
    out._pd_site = site
    out._pd_transposed = transposed
    return out


def plain(t):
    """The plain tensor behind a :class:`GuidedValue` (``t`` itself otherwise)."""
    return t._pd_plain if isinstance(t, GuidedValue) else t


def laid_out(t):
    """A guided value with its batch dims laid out along its plates (as the model's plates
    expect; differs from :func:`plain` only for ``Predictive(parallel=True)``'s samples)."""
    if not isinstance(t, GuidedValue):
        return t
    v = t._pd_site.value
    return v.transpose(-1, -2) if t._pd_transposed else v


def _unwrap(tree):
    return map_tensors(tree, laid_out)


_CONTAINERS = (list, tuple, dict)


def _fallback(func, args, kwargs):
    """Compute on plain tensors; report the use when the result holds a tensor (a metadata
    query such as ``w.shape`` or ``w.dim()`` is not a use)."""
    if not any(isinstance(a, _CONTAINERS) for a in args) and not any(
        isinstance(v, _CONTAINERS) for v in kwargs.values()
    ):
        # Flat arguments (the common case: an ELBO's log density of a weight, ``w * 2``):
        # without walking nested arguments, which cost more than the op on a small network
        # (measured: a third of a user's eager SVI step with AutoConcreteDropout at W1).
        guided = [a for a in args if isinstance(a, GuidedValue)]
        guided += [v for v in kwargs.values() if isinstance(v, GuidedValue)]
        out = func(*map(laid_out, args), **{k: laid_out(v) for k, v in kwargs.items()})
        holds = torch.is_tensor(out) or (isinstance(out, _CONTAINERS) and bool(tensors(out)))
    else:
        out = func(*_unwrap(args), **_unwrap(kwargs))
        holds = bool(tensors(out))
        guided = [v for v in tensors((args, kwargs)) if isinstance(v, GuidedValue)]
    if holds:
        name = _op_name(func)
        for v in guided:
            v._pd_site.owner.unsupported_use(v._pd_site, name)
    return out


def _op_name(func):
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if name == "getset_descriptor.__get__":
        return "a tensor attribute"
    name = name.replace("_VariableFunctionsClass.", "torch.")
    return name.replace("_TensorBase.", "Tensor.").replace("TensorBase.", "Tensor.")


# -- transposes: keep the site ---------------------------------------------------------------


def _event_transpose(args, kwargs, check):
    w = args[0] if args else kwargs.get("input")  # torch.t(input=w) passes it by keyword
    if not isinstance(w, GuidedValue) or w._pd_site.event_dim != 2 or not check(args, kwargs):
        return NotImplemented
    base = w._pd_plain
    t = base.transpose(-1, -2)
    return wrap(t, w._pd_site, transposed=not w._pd_transposed)


def _always(args, kwargs):
    # .T, .mT, .t(), torch.t(w) and torch.t(input=w): the only argument is the matrix
    return len(args) + len(kwargs) == 1


def _swaps_matrix_dims(args, kwargs):
    # transpose(d0, d1) on the user's (unbatched) matrix: dims 0/1 or -1/-2.
    dims = list(args[1:]) + [kwargs.get("dim0"), kwargs.get("dim1")]
    dims = [d for d in dims if d is not None]
    return len(dims) == 2 and {d % 2 for d in dims} == {0, 1}


def _reverses_matrix_dims(args, kwargs):
    dims = args[1:] if len(args) > 2 else (args[1] if len(args) == 2 else kwargs.get("dims"))
    dims = tuple(dims) if dims is not None else ()
    return len(dims) == 2 and tuple(d % 2 for d in dims) == (1, 0)


# -- products and convolutions: ask the owner ------------------------------------------------


def _linear(args, kwargs):
    names = ("input", "weight", "bias")
    a = dict(zip(names, args, strict=False)) | kwargs
    x, w, b = a.get("input"), a.get("weight"), a.get("bias")
    if not isinstance(w, GuidedValue) or isinstance(x, GuidedValue):
        return NotImplemented
    return w._pd_site.owner.answer_linear(x, w, b, transposed_layout=w._pd_transposed)


def _matmul(args, kwargs, vector_on_left=True):
    if kwargs or len(args) != 2:
        return NotImplemented
    x, w = args
    if vector_on_left and isinstance(x, GuidedValue) and x._pd_site.event_dim == 1:
        # ``w @ x`` with a weight vector w (in,) on the left: x (..., in, n) -> (..., n) is
        # ``x.mT @ w`` (each of the n columns an example), a 1-D x gives the dot product.
        v, x = x, w
        if isinstance(x, GuidedValue) or not torch.is_tensor(x) or x.dim() < 1:
            return NotImplemented
        rows = x if x.dim() == 1 else x.mT
        return v._pd_site.owner.answer_linear(rows, v, None, transposed_layout=True)
    if not isinstance(w, GuidedValue) or isinstance(x, GuidedValue) or not torch.is_tensor(x):
        return NotImplemented
    if x.dim() < 1 or w._pd_site.event_dim not in (1, 2):
        return NotImplemented
    # ``x @ w.T`` with w (out, in) is F.linear; ``x @ w`` with w (in, out) or (in,) is the
    # same product with the weight stored transposed.
    return w._pd_site.owner.answer_linear(x, w, None, transposed_layout=not w._pd_transposed)


_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _conv(ndim, args, kwargs):
    a = dict(zip(_CONV_ARGS, args, strict=False)) | kwargs
    x, w = a.get("input"), a.get("weight")
    if not isinstance(w, GuidedValue) or isinstance(x, GuidedValue) or w._pd_transposed:
        return NotImplemented
    return w._pd_site.owner.answer_conv(
        x,
        w,
        a.get("bias"),
        ndim=ndim,
        stride=a.get("stride", 1),
        padding=a.get("padding", 0),
        dilation=a.get("dilation", 1),
        groups=a.get("groups", 1),
    )


#: Queries that read metadata only (fast path; Pyro and the layers ask them often).
_METADATA = frozenset(
    [getattr(torch.Tensor, a).__get__ for a in ("shape", "dtype", "device", "ndim", "is_leaf")]
    + [getattr(torch.Tensor, a).__get__ for a in ("requires_grad", "grad_fn", "layout")]
    + [torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride]
    + [torch.Tensor.is_floating_point, torch.Tensor.__len__, torch.Tensor.is_contiguous]
)

#: Public name of :data:`_METADATA` (the loss capture passes these queries through).
METADATA = _METADATA

_HANDLERS = {
    # a property's getter is what __torch_function__ receives (torch's stubs type T as a Tensor)
    torch.Tensor.T.__get__: lambda a, k: _event_transpose(a, k, _always),  # type: ignore[attr-defined]
    torch.Tensor.mT.__get__: lambda a, k: _event_transpose(a, k, _always),  # type: ignore[attr-defined]
    torch.Tensor.t: lambda a, k: _event_transpose(a, k, _always),
    torch.t: lambda a, k: _event_transpose(a, k, _always),
    torch.Tensor.transpose: lambda a, k: _event_transpose(a, k, _swaps_matrix_dims),
    torch.transpose: lambda a, k: _event_transpose(a, k, _swaps_matrix_dims),
    torch.Tensor.permute: lambda a, k: _event_transpose(a, k, _reverses_matrix_dims),
    torch.permute: lambda a, k: _event_transpose(a, k, _reverses_matrix_dims),
    F.linear: _linear,
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.mm: lambda a, k: _matmul(a, k, vector_on_left=False),  # mm takes matrices only
    torch.Tensor.mm: lambda a, k: _matmul(a, k, vector_on_left=False),
    # the conv handler is called per use (not built at import) so that each call runs the
    # current code (mutation testing swaps functions at call time)
    F.conv1d: lambda a, k: _conv(1, a, k),
    F.conv2d: lambda a, k: _conv(2, a, k),
}

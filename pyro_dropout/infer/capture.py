"""Capture a loss function's tensor operations once and replay them as an FX graph.

Why our own capture (measured on the speed benchmark's W1 workload, one CPU thread, torch
2.13): TorchScript tracing, which did this before, is deprecated upstream and reached into its
internals; ``torch.export`` (non-strict) runs Pyro's handlers as ordinary Python but fakes every
tensor, so the subclass that routes guided weights cannot be built, and it took 3.6 s to export
the 8-50-1 loss (a 3,000-step fit of plain steps takes ~1.2 s); ``torch.compile`` took 47 s and
split the loss into 21 graphs. Here the loss runs **once, eagerly, on real tensors** under a
:class:`torch.overrides.TorchFunctionMode` (the documented way to see every call of torch's
Python API in a scope; "Extending torch Python API" → modes), which records each call; the
record becomes a :class:`torch.fx.Graph` (public), simplified and run by an
:class:`torch.fx.GraphModule`. A step then runs only the loss's tensor operations, without
Pyro's effect handlers.

Because the capture ran on real tensors, every value it saw is known, so the graph is simplified
with certainty rather than by shape reasoning: a call whose inputs depend on neither the graph's
inputs nor a random draw is replaced by the value it returned (the prior's constants, the
constant parts of a KL), calls nothing uses are dropped, and identical calls are merged. A call
is a random draw when it moved a random generator's state (checked around each call), so an
unknown sampler is never folded into a constant.

What a capture cannot see (the same limits as any trace): Python control flow that depends on
data or draws is frozen (the caller captures twice and compares, see
:class:`~pyro_dropout.infer.JitMeanFieldELBO`), and a value read into Python (``.item()``)
becomes a constant. :func:`capture` refuses what it cannot replay faithfully (an in-place
update of a tensor it did not create, a tensor subclass it does not know) with
:class:`CaptureError`, and the caller checks the replay against the eager run it recorded.
"""

import operator
import sys
import types
from collections.abc import Callable
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode

from .._nested import map_tensors as _map
from .._nested import tensors as _tensors
from .._trace import ACTIVE
from ..nn import guided_value

__all__ = ["CaptureError", "Captured", "CapturedFunction", "capture"]


class CaptureError(RuntimeError):
    """The loss cannot be captured faithfully (the message says why)."""


def _inplace(func):
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("__")) or name in (
        "__setitem__",
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
    )


class _RngWatch:
    """Whether a call moved a random generator (CPU, and CUDA where tensors live there)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def state(self):
        s = [torch.random.get_rng_state()]
        if self.cuda:
            s.append(torch.cuda.get_rng_state())
        return s

    def set(self, state):
        torch.random.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state(state[1])

    @staticmethod
    def moved(before, after):
        return any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


class _Call:
    __slots__ = ("func", "args", "kwargs", "out", "grad", "random")

    def __init__(self, func, args, kwargs, out, grad, random):
        self.func, self.args, self.kwargs, self.out = func, args, kwargs, out
        self.grad, self.random = grad, random


class _Recorder(TorchFunctionMode):
    """Records each call of torch's Python API that returns tensors; calls on guided weight
    values (:class:`~pyro_dropout.nn.guided_value.GuidedValue`) are answered by the value's own
    rule with the recorder active, so that the operations the rule makes are recorded."""

    def __init__(self, rng, inputs):
        super().__init__()
        self.calls = []
        self.rng = rng
        #: ids of the tensors that depend on an input or a draw (the others are constants)
        self.dynamic = {id(t) for t in inputs if isinstance(t, torch.Tensor)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in guided_value.METADATA:  # shape queries: plain values, nothing to record
            return func(*_map(args, guided_value.plain), **_map(kwargs, guided_value.plain))
        if any(isinstance(t, guided_value.GuidedValue) for t in _tensors((args, kwargs))):
            with self:  # the rule's own operations are recorded
                return guided_value.GuidedValue.__torch_function__(func, types, args, kwargs)
        before = self.rng.state()
        out = func(*args, **kwargs)
        if not _tensors(out):
            return out  # a number or a shape read into Python: frozen where it is used
        random = _RngWatch.moved(before, self.rng.state())
        self.calls.append(_Call(func, args, kwargs, out, torch.is_grad_enabled(), random))
        if random or any(id(t) in self.dynamic for t in _tensors((args, kwargs))):
            self.dynamic.update(id(t) for t in _tensors(out))
        return out


_PY_THRESHOLD = torch.nn.functional.threshold  # the public name of its Python wrapper

#: Python wrappers of torch's and the method they call (for a tensor first operand, as here).
_DIRECT = {torch.Tensor.__pow__: torch.Tensor.pow, torch.Tensor.__rsub__: torch.rsub}


def _target(func, grad=None):
    """``func`` as an FX target, run with gradients on or off where ``grad`` is a bool. FX's
    generated code names a Python function by its module and name, which for some of torch's
    (``Tensor.__pow__`` is a wrapper named ``pow`` in ``torch._tensor``) does not lead back to
    it: those are called through a function of this module (one more Python call)."""
    func = _DIRECT.get(func, func)
    if grad is None:
        name = getattr(func, "__name__", None)
        if isinstance(func, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            if getattr(torch.Tensor, name, None) is func:
                return func  # a tensor method: FX names it itself
        elif isinstance(func, (types.FunctionType, types.BuiltinFunctionType)) and name:
            module = sys.modules.get(getattr(func, "__module__", None) or "")
            if getattr(module, name, None) is func:
                return func

        def call(*args, **kwargs):
            return func(*args, **kwargs)

    else:

        def call(*args, **kwargs):
            with torch.set_grad_enabled(grad):
                return func(*args, **kwargs)

    name = getattr(func, "__name__", "call").strip("_") or "call"
    call.__name__ = call.__qualname__ = name if grad is None else f"{name}_grad_{grad}"
    return call


class Captured:
    """A captured loss: ``captured(*inputs)`` replays it. ``text`` describes the recorded calls
    (functions, shapes and the Python values they took), for comparing two captures; ``module``
    is the simplified :class:`torch.fx.GraphModule`; ``ops`` the number of calls it runs."""

    def __init__(self, module: fx.GraphModule, text: str, ops: int) -> None:
        self.module = module
        self.text = text
        self.ops = ops
        self._forward = module.forward  # without nn.Module's call machinery (hooks: none)

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph

    def __call__(self, *inputs: Any) -> Any:
        return self._forward(*inputs)


class CapturedFunction:
    """A Pyro function (a loss) captured on its first call, its Pyro parameters made inputs:
    ``captured`` is the :class:`Captured` graph of ``(unconstrained values of param_names...,
    *args)``; later calls replay it. As :func:`pyro.ops.jit.trace` does, parameters are found
    by a first run under ``poutine.trace(param_only=True)`` (which also creates them), and the
    values a call reads through ``pyro.param`` are the param store's, made from the
    unconstrained tensors the graph takes (so the gradients reach them). Keyword arguments and
    non-tensor arguments are constants of the graph (the caller keys graphs by them)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.captured: Captured | None = None
        self.param_names: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.captured is None:
            with poutine.block(), poutine.trace(param_only=True) as first:
                self.fn(*args, **kwargs)
            # sorted: the graph's inputs must come in the same order in every capture
            self.param_names = sorted(set(first.trace.nodes))
            fn, names = self.fn, self.param_names

            def replayed(*params_and_args):
                params = {name: pyro.param(name) for name in names}
                return poutine.replay(fn, params=params)(*params_and_args[len(names) :], **kwargs)

            inputs = self.params() + args
            with pyro.validation_enabled(False):  # (its checks read values into Python)
                out, self.captured = capture(replayed, inputs)
            return out
        return self.captured(*self.params(), *args)

    def params(self) -> tuple[torch.Tensor, ...]:
        """The unconstrained tensors of the captured parameters, from the param store."""
        return tuple(pyro.param(name).unconstrained() for name in self.param_names)


def _describe(value, where):
    """An argument in a capture's text: a tensor by its shape and, where it is a constant met
    for the first time (not an input nor made by a recorded call), a digest of its values (a
    constant made outside torch's API from the data, e.g. through NumPy, then differs between
    two captures)."""
    if isinstance(value, torch.Tensor):
        digest = ""
        if id(value) not in where and value.numel() and not value.is_complex():
            digest = f"={float(value.detach().double().sum()):.6g}"
        return f"T{tuple(value.shape)}{value.dtype}{digest}"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_describe(v, where) for v in value)}]"
    return repr(value)


def capture(fn: Callable[..., Any], inputs: tuple) -> tuple[Any, Captured]:
    """Run ``fn(*inputs)`` once, recording it, and return ``(output, Captured)``: the output of
    that run and a replay of it as a simplified FX graph of the inputs.

    Checked before it is returned: the graph, run on the same random stream, must give the
    recorded output and the same gradients for the inputs that require them (else
    :class:`CaptureError`). Draws that nothing uses are then dropped (e.g. the weights a guide
    samples where local reparameterisation draws pre-activations instead), so a replay after
    that consumes the random stream differently from an eager call (same distribution)."""
    cuda = any(t.is_cuda for t in inputs if isinstance(t, torch.Tensor))
    rng = _RngWatch(cuda)
    start = rng.state()
    recorder = _Recorder(rng, inputs)
    ACTIVE.append(recorder)
    try:
        with recorder:
            out = fn(*inputs)
    finally:
        ACTIVE.pop()
    outs = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(t, torch.Tensor) for t in outs):
        raise CaptureError(f"the function returned {type(out).__name__}, not tensors")
    graph, root, text = _build(recorder.calls, inputs, out)
    del recorder
    # (Passes that changed no graph of the library's models were removed, issue 38: folding
    # sums of linear combinations and sums of sums, which `_combine_outputs` does for the loss,
    # and merging a clamp of a clamp; measured on the speed workloads, the heteroscedastic,
    # learned-prior, classification and conv networks under the four guides, 2026-11-29.
    # And a pass that no longer paid: full sums of squares as one `mse_loss` (since squares
    # are products, fit's step with and without it equal within the noise at W1 and W2 for
    # the four guides, one CPU thread, interleaved rounds, 2026-11-30.)
    _merge_repeats(graph)
    _drop_unused(graph, draws=False)
    _fuse_linear_bias(graph)
    _combine_outputs(graph, root)
    _drop_unused(graph, draws=False)
    _square_as_product(graph)
    module = fx.GraphModule(root, graph)
    _check(module, inputs, outs, rng, start)
    _drop_unused(graph)
    module = fx.GraphModule(root, graph)
    # GraphModule makes the constants buffers, read through nn.Module.__getattr__ at every
    # replay (~1 us each); plain attributes are found directly.
    for name, t in list(module.named_buffers(recurse=False)):
        delattr(module, name)
        setattr(module, name, t)
    return out, Captured(module, text, sum(1 for n in graph.nodes if n.op == "call_function"))


def _close(a, b):
    """Equal up to float rounding (folded sums add in another order)."""
    finite = a[torch.isfinite(a)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return a.shape == b.shape and torch.allclose(
        a, b, rtol=1e-4, atol=1e-5 * scale + 1e-12, equal_nan=True
    )


def _check(module, inputs, outs, rng, start):
    """Replay ``module`` on the random stream the capture started from; its outputs and the
    gradients of the inputs must equal the recorded run's."""
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = wrt and outs[0].requires_grad
    expected = (
        torch.autograd.grad(outs[0].sum(), wrt, retain_graph=True, allow_unused=True)
        if grads
        else ()
    )
    end = rng.state()
    rng.set(start)
    try:
        again = module(*inputs)
    finally:
        rng.set(end)
    again = again if isinstance(again, tuple) else (again,)
    same = [a.requires_grad == b.requires_grad for a, b in zip(outs, again, strict=True)]
    got = None
    if all(same):
        got = torch.autograd.grad(again[0].sum(), wrt, allow_unused=True) if grads else ()
    pairs = list(zip(outs, again, strict=True)) + list(zip(expected, got or (), strict=False))
    for a, b in [*pairs, *([(None, 0)] if got is None else [])]:
        if (a is None) != (b is None) or (a is not None and not _close(a.detach(), b.detach())):
            raise CaptureError(
                "the replayed graph does not reproduce the recorded call (its output or "
                "gradients differ): an operation ran outside torch's Python API (e.g. a custom "
                "autograd.Function or a C extension)"
            )


def _build(calls, inputs, out):
    graph = fx.Graph()
    where = {}  # id(tensor) -> node
    depends = set()  # ids of nodes that depend on an input or a draw
    constants = {}
    mutated = set()
    text = []

    const_storage = set()  # storages of constants: a view of one is a constant too

    def const(t):
        name = f"c{len(constants)}"
        constants[name] = t
        node = graph.get_attr(name)
        where[id(t)] = node
        const_storage.add(_storage(t))
        return node

    for i, t in enumerate(inputs):
        node = graph.placeholder(f"input{i}")
        if torch.is_tensor(t):
            node.meta["shape"] = tuple(t.shape)
            node.meta["like"] = (t.dtype, t.device)
        where[id(t)] = node
        depends.add(node)
    # A tensor updated in place is never a constant (its storage changes on every replay).
    for c in calls:
        if _inplace(c.func) or "out" in c.kwargs:
            target = c.args[0] if c.args else c.kwargs.get("out")
            if isinstance(target, torch.Tensor):
                mutated.add(_storage(target))

    def arg(v):
        n = where.get(id(v))
        if n is None:
            if isinstance(v, guided_value.GuidedValue):
                raise CaptureError("a guided weight value escaped its rule")
            n = const(v)
        return n

    for c in calls:
        text.append(
            f"{getattr(c.func, '__qualname__', repr(c.func))}"
            f"({', '.join(_describe(a, where) for a in c.args)}; {sorted(c.kwargs)}; "
            f"grad={c.grad})"
        )
        args = _map(c.args, arg)
        kwargs = _map(c.kwargs, arg)

        uses: set[fx.Node] = set()
        fx.map_arg((args, kwargs), uses.add)  # (public: the nodes in nested arguments)
        inplace = _inplace(c.func) or "out" in c.kwargs
        outs = _tensors(c.out)
        resolved = {}  # output index -> a node it is without a call (constant or alias)
        if not (c.random or inplace) and not any(_storage(t) in mutated for t in outs):
            single = isinstance(c.out, torch.Tensor)
            for k, t in enumerate([c.out] if single else c.out):
                if not isinstance(t, torch.Tensor):
                    continue
                if not any(n in depends for n in uses) or _storage(t) in const_storage:
                    resolved[k] = const(t)  # folded: the value it returned
                else:
                    alias = _alias_of(t, c.args, c.kwargs)
                    if alias is not None:  # (a view equal to) one of its inputs
                        resolved[k] = where[id(t)] = where[id(alias)]
            if len(resolved) == len(outs):
                continue
        if c.func in _BINARY and len(args) == 2 and not kwargs and torch.is_tensor(c.out):
            args, values = _scalar_operands(c, args, constants)
            keep = _identity_operand(c, args, values)
            if keep is not None:
                where[id(c.out)] = keep
                continue
        func = c.func
        if func is _PY_THRESHOLD and not kwargs.get("inplace", False) and len(args) == 3:
            func, kwargs = torch.threshold, {}  # F.threshold's Python wrapper, skipped
        grad = None if c.grad == torch.is_grad_enabled() else c.grad
        node = graph.call_function(_target(func, grad), args, kwargs)
        node.meta["func"] = c.func
        node.meta["grad"] = grad
        node.meta["pure"] = not (c.random or inplace)
        if torch.is_tensor(c.out):
            node.meta["shape"] = tuple(c.out.shape)
            node.meta["like"] = (c.out.dtype, c.out.device)
        depends.add(node)
        if isinstance(c.out, torch.Tensor):
            where[id(c.out)] = node
        elif isinstance(c.out, (list, tuple)):
            for k, t in enumerate(c.out):
                if isinstance(t, torch.Tensor) and k not in resolved:
                    item = graph.call_function(operator.getitem, (node, k))
                    where[id(t)] = item
                    depends.add(item)
        else:
            raise CaptureError(f"{c.func} returned {type(c.out).__name__}")
    graph.output(_map(out, arg))
    root = torch.nn.Module()
    for name, t in constants.items():
        # attributes, not buffers: a buffer would follow .to() and lose its identity
        setattr(root, name, t.detach())
    return graph, root, "\n".join(text)


_T = torch.Tensor
#: Elementwise binary operations (operand order as called): a constant operand whose elements
#: are all equal is a Python number there, and some numbers leave the other operand as it is.
_BINARY: dict[object, str] = {
    **dict.fromkeys([_T.add, _T.__add__, _T.__radd__, torch.add], "add"),
    **dict.fromkeys([_T.sub, _T.__sub__, torch.sub], "sub"),
    **dict.fromkeys([_T.mul, _T.__mul__, _T.__rmul__, torch.mul], "mul"),
    **dict.fromkeys([_T.div, _T.__truediv__, torch.div], "div"),
    **dict.fromkeys([_T.__rsub__, _T.__rtruediv__], "reflected"),
}
#: The number that leaves the first operand unchanged, per operation.
_NEUTRAL = {"add": 0, "sub": 0, "mul": 1, "div": 1}


def _scalar_operands(call, args, constants):
    """``args`` with each constant tensor operand whose elements are all equal replaced by that
    number, where the other operand alone has the result's shape and dtype (so broadcasting and
    type promotion are unchanged)."""
    out, values = list(args), list(call.args)
    for k, node in enumerate(args):
        other = call.args[1 - k]
        if not (isinstance(node, fx.Node) and node.op == "get_attr"):
            continue
        value = constants[node.target]
        if not (
            torch.is_tensor(other)
            and other.shape == call.out.shape
            and other.dtype == call.out.dtype
            and value.dtype == call.out.dtype
            and value.is_floating_point()
            and not value.requires_grad
        ):
            continue
        first = value.reshape(-1)[0]
        if value.numel() == 0 or not bool((value == first).all()):
            continue
        if k == 0 and _BINARY[call.func] not in ("add", "mul"):
            continue  # a number first: only where the operation is symmetric
        out[k] = values[k] = first.item()
        if k == 0:  # ``Tensor.mul`` takes the tensor first
            out.reverse()
            values.reverse()
        break
    return tuple(out), values


def _identity_operand(call, args, values):
    """The node of the operand that ``call`` returned unchanged (``x * 1``, ``x + 0``...);
    ``values`` are the operands' values in the order of ``args``."""
    kind = _BINARY[call.func]
    for k in (0, 1):
        number, node = args[k], args[1 - k]
        if not (isinstance(node, fx.Node) and type(number) in (int, float)):
            continue
        if k == 0 and kind not in ("add", "mul"):
            continue
        tensor = values[1 - k]
        if (
            _NEUTRAL.get(kind) == number
            and tensor.shape == call.out.shape
            and tensor.dtype == call.out.dtype
            and tensor.requires_grad == call.out.requires_grad
        ):
            return node
    return None


def _storage(t):
    return (t.device, t.untyped_storage().data_ptr())


def _same_view(a, b):
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
        and a.requires_grad == b.requires_grad
    )


def _alias_of(out, args, kwargs):
    """The argument ``out`` is (or is a view of, with the same shape, strides and autograd
    status), if any: ``expand`` or ``reshape`` to the shape a tensor has, ``as_tensor`` of a
    tensor, ``broadcast_tensors`` of one shape. ``detach`` is kept: it differs in autograd."""
    if not isinstance(out, torch.Tensor):
        return None
    for a in _tensors((args, kwargs)):
        if a is out or _same_view(a, out):
            return a
    return None


def _merge_repeats(graph):
    """One node for calls that repeat an earlier one (same function, same arguments), unless
    a draw or an in-place update: e.g. a scale's square, read by the local reparameterisation
    and by the KL."""
    seen = {}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is not operator.getitem and not node.meta.get("pure", False):
            continue
        if any(_updates(user, node) for user in node.users):
            continue  # two buffers that are filled in place are two tensors
        try:
            key = (node.target, _freeze(node.args), _freeze(node.kwargs))
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
        else:
            seen[key] = node


def _updates(user, node):
    """Whether ``user`` updates ``node``'s tensor in place."""
    func = user.meta.get("func")
    return (func is not None and _inplace(func) and user.args and user.args[0] is node) or (
        "out" in user.kwargs
    )


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, float):
        return ("float", v)  # 1.0 and 1 differ in type promotion
    return v


def _drop_unused(graph, draws=True):
    """Remove calls whose results nothing uses, except in-place updates of tensors something
    else uses (they change what later calls read), and draws unless ``draws``."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users:
            if not draws and node.target is not operator.getitem and not node.meta.get("pure"):
                continue
            if node.target is not operator.getitem and _inplace(node.meta["func"]):
                target = node.args[0] if node.args else None
                if not (isinstance(target, fx.Node) and len(target.users) == 1):
                    continue
            graph.erase_node(node)
    for node in reversed(list(graph.nodes)):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)


# -- sums of linear combinations ---------------------------------------------------------------
_NEG = frozenset([torch.Tensor.neg, torch.Tensor.__neg__, torch.neg])
_SUM = frozenset([torch.Tensor.sum, torch.sum])


class _Form:
    """An elementwise linear combination ``const + sum(coef * leaf)`` of same-shaped nodes."""

    def __init__(self, terms=None, const=0.0):
        self.terms = dict(terms or {})
        self.const = const

    def scaled(self, k):
        return _Form({n: c * k for n, c in self.terms.items()}, self.const * k)

    def plus(self, other, sign=1.0):
        terms = dict(self.terms)
        for n, c in other.terms.items():
            terms[n] = terms.get(n, 0.0) + sign * c
        return _Form(terms, self.const + sign * other.const)


def _number(v):
    return type(v) in (int, float)


def _linear_form(node, func, part, leaf):
    """``node`` a negation, a sum or difference of two parts, a part times or over a number,
    or a number minus a part, as a :class:`_Form` (``part(v)`` the form of an operand, ``None``
    where it has none); ``leaf`` otherwise."""
    if func in _NEG and len(node.args) == 1:
        a = part(node.args[0])
        return leaf if a is None else a.scaled(-1.0)
    kind = _BINARY.get(func)
    if kind is None or len(node.args) != 2:
        return leaf
    a, b = node.args
    if kind in ("add", "sub"):
        fa, fb = part(a), part(b)
        if fa is None or fb is None:
            return leaf
        return fa.plus(fb, 1.0 if kind == "add" else -1.0)
    if kind in ("mul", "div") and _number(b) and not (kind == "div" and b == 0):
        fa = part(a)
        return leaf if fa is None else fa.scaled(float(b) if kind == "mul" else 1.0 / float(b))
    if kind == "reflected" and func is torch.Tensor.__rsub__ and _number(b):
        fa = part(a)
        return leaf if fa is None else fa.scaled(-1.0).plus(_Form(const=float(b)))
    return leaf


def _meta(new, like):
    new.meta["func"] = new.target
    new.meta["grad"] = None
    new.meta["pure"] = True
    new.meta["shape"] = like.meta["shape"]
    new.meta["like"] = like.meta.get("like")
    return new


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _combine_outputs(graph, root):
    """Each scalar output that is a linear combination of three or more scalars (the loss: the
    data term and every site's KL, each scaled) as one product, ``stack(terms) @ coefs +
    const``, each term the full sum of a tensor: three operations instead of one per term, per
    partial sum, per scaling and per reshape to a scalar."""
    (output,) = [n for n in graph.nodes if n.op == "output"]
    values = output.args[0]
    outs = list(values) if isinstance(values, tuple) else [values]
    for k, node in enumerate(outs):
        if not isinstance(node, fx.Node) or node.meta.get("shape") != ():
            continue
        form = _sum_form(node)
        terms = [(leaf, c) for leaf, c in form.terms.items() if c != 0.0]
        if len(terms) < 3:
            continue
        name = f"coefs{k}"
        likes = {leaf.node.meta.get("like") for leaf, _ in terms}
        if len(likes) != 1 or None in likes:
            continue  # leaves of several dtypes or devices (or unknown): left as they are
        ((dtype, device),) = likes
        coefs = [c for _, c in terms]
        with graph.inserting_before(output):
            leaves = [leaf.emit(graph, node) for leaf, _ in terms]
            if form.const != 0.0:
                # The constant as a term of the product (times a stacked 1): no addition after
                # it. (Rounded to the loss's dtype once more: the loss's own rounding.)
                setattr(root, f"{name}_one", torch.ones((), dtype=dtype, device=device))
                leaves.append(graph.get_attr(f"{name}_one"))
                coefs.append(form.const)
            stacked = graph.call_function(torch.stack, (leaves,))
            attr = graph.get_attr(name)
            total = graph.call_function(torch.Tensor.dot, (stacked, attr))
        setattr(root, name, torch.tensor(coefs, dtype=dtype, device=device))
        for n in (stacked, total):
            _meta(n, node)
        stacked.meta["shape"] = (len(leaves),)
        node.replace_all_uses_with(total, delete_user_cb=lambda user: user is output)


class _FullSum:
    """A leaf of a scalar combination: the sum of all of ``node``'s elements (the node itself
    where it is a 0-dim tensor)."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    def __hash__(self):
        return hash((_FullSum, self.node))

    def __eq__(self, other):
        return isinstance(other, _FullSum) and other.node is self.node

    def emit(self, graph, like):
        if self.node.meta.get("shape") == ():
            return self.node
        out = graph.call_function(torch.Tensor.sum, (self.node,))
        _meta(out, like)
        out.meta["like"] = self.node.meta.get("like")
        return out


_POW = frozenset([torch.Tensor.pow, torch.Tensor.__pow__, torch.pow])


def _square_as_product(graph):
    """``pow(a, 2)`` as ``a * a``: the same values (ATen squares by multiplying) and gradients
    (``pow``'s ``g·(2a)`` is ``g·a + g·a`` to the bit; where ``a`` has other readers, autograd
    adds the contributions in another order), where ``pow``'s backward takes three kernels:
    forward and backward of a 50 × 8 softplus scale's square 16 → 9 us (one CPU thread, torch
    2.13, 2026-11-29, issue 38)."""
    for node in graph.nodes:
        args = node.args
        if (
            node.op == "call_function"
            and node.meta.get("func") in _POW
            and not node.kwargs
            and node.meta.get("grad") is None
            and isinstance(args[0], fx.Node)
            and type(args[1]) in (int, float)
            and args[1] == 2
            # (an integer tensor to the power 2.0 is a float tensor; times itself, an integer)
            and args[0].meta.get("like") == node.meta.get("like") is not None
        ):
            node.target = node.meta["func"] = torch.Tensor.mul
            node.args = (args[0], args[0])


_SHAPE_ONLY = frozenset(
    [torch.Tensor.reshape, torch.Tensor.view, torch.reshape, torch.Tensor.squeeze]
    + [torch.squeeze, torch.Tensor.unsqueeze, torch.unsqueeze, torch.Tensor.flatten]
    + [torch.flatten]
)


def _sum_form(x):
    """The sum of all of ``x``'s elements as a :class:`_Form` over :class:`_FullSum` leaves,
    seen through what keeps it a linear combination of other full sums: reshapes, partial
    sums, negations, sums and differences of operands of ``x``'s shape (or of one element
    each), scalings by numbers, and numbers (each counted once per element)."""
    leaf = _Form({_FullSum(x): 1.0})
    if x.op != "call_function" or x.meta.get("grad") is not None or "shape" not in x.meta:
        return leaf
    func, args, shape = x.meta.get("func"), x.args, x.meta["shape"]
    a = args[0] if args else None
    if (
        (func in _SHAPE_ONLY or (func in _SUM and "dtype" not in x.kwargs))
        and isinstance(a, fx.Node)
        and "shape" in a.meta
        and a.meta.get("like") == x.meta.get("like")  # (not a view as another dtype)
    ):
        return _sum_form(a)  # the same elements, or a partial sum of them
    if x.kwargs:
        return leaf
    n = _numel(shape)

    def part(v):
        if _number(v):
            return _Form(const=float(v) * n)
        if isinstance(v, fx.Node) and "shape" in v.meta:
            if v.meta["shape"] == shape or _numel(v.meta["shape"]) == n == 1:
                return _sum_form(v)
        return None

    return _linear_form(x, func, part, leaf)


def _fuse_linear_bias(graph):
    """``F.linear(x, w) + b`` with ``b`` of the output's last size (or 0-d) as ``F.linear(x, w, b)``
    (one kernel; the local reparameterisation adds its bias after the product). Where ``b`` is
    computed after the product (a Gaussian family's bias variance σ_b², read after the weights'
    product), the product moves down to the sum, unless a call between them writes in place."""
    for node in list(graph.nodes):
        if node.op != "call_function" or _BINARY.get(node.meta.get("func")) != "add":
            continue
        if node.kwargs or len(node.args) != 2 or node.meta.get("grad") is not None:
            continue
        lin, bias = node.args
        if not (
            isinstance(lin, fx.Node)
            and isinstance(bias, fx.Node)
            and lin.meta.get("func") is torch.nn.functional.linear
            and lin.meta.get("grad") is None
            and not lin.kwargs
            and lin.args[2:] in ((), (None,))
            and len(lin.users) == 1
            and lin.meta.get("shape") == node.meta.get("shape")
            and bias.meta.get("shape") in (lin.meta["shape"][-1:], ())  # F.linear takes both
            and bias.meta.get("like") == lin.meta.get("like")
        ):
            continue
        between = []  # the calls from the product to the sum
        n = lin.next
        while n is not node:
            between.append(n)
            n = n.next
        if any(
            n.op == "call_function" and _updates(n, n.args[0] if n.args else None) for n in between
        ):
            continue
        if bias in between:
            node.prepend(lin)
        lin.args = (lin.args[0], lin.args[1], bias)
        node.replace_all_uses_with(lin)
        graph.erase_node(node)

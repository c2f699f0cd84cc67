"""Simplify a traced loss graph before it first runs: fewer operations per training step.

Why: a trace of a Pyro loss records every tensor operation of one call, including the many
that act only on constants (a fixed prior's ``zeros(...) + scale``, its ``expand``, the
constant parts of a closed-form KL, the dropout rate's ``1 - p``) and the shape bookkeeping
of broadcasting (``aten::size`` → ``Int`` → ``NumToTensor`` chains, ``expand``/``reshape`` to
the shape a tensor already has). TorchScript's interpreter runs each of them on every step,
and autograd records each that touches a parameter. Measured on the speed benchmark's W1
workload (8-50-1, batch 32, ``AutoDropout``): 346 ``aten::`` ops as traced, 67 after
:func:`simplify`, with the same outputs for the same random stream (tests in
``tests/infer/test_graph_passes.py``; the other guides: ``docs/benchmarks/speed.md``).

The passes are TorchScript's own (peephole with shape information, constant propagation,
common-subexpression elimination, dead-code elimination; none of them folds or merges a
random draw) plus three of ours: drop ops whose result has exactly the type, shape and strides
of an input (a trace's graph carries complete shapes, so this is known), read constants out of
broadcasts, and add a bias vector inside the ``linear`` that produced its operand.
"""

import torch

__all__ = ["count_ops", "simplify"]

#: Ops that return their input (or an alias of it with the same shape and strides) when the
#: result's complete type equals the input's.
_IDENTITY_WHEN_SAME_TYPE = frozenset(
    {
        "aten::expand",
        "aten::expand_as",
        "aten::reshape",
        "aten::view",
        "aten::to",
        "aten::contiguous",
    }
)


def count_ops(graph):
    """Number of ``aten::`` operations in a TorchScript graph (what the interpreter runs as
    kernels; constants, lists and unpacking aside)."""
    return sum(1 for n in graph.nodes() if n.kind().startswith("aten::"))


def _complete(t):
    return (
        isinstance(t, torch._C.TensorType)
        and t.sizes() is not None
        and t.strides() is not None
        and t.scalarType() is not None
        and t.device() is not None
    )


def _same_type(a, b):
    return (
        _complete(a)
        and _complete(b)
        and a.sizes() == b.sizes()
        and a.strides() == b.strides()
        and a.scalarType() == b.scalarType()
        and a.device() == b.device()
        and a.requires_grad() == b.requires_grad()
    )


def _copies(node):
    """Whether an ``aten::to`` asks for a copy (a ``True`` among its constant bool flags)."""
    for value in list(node.inputs())[1:]:
        producer = value.node()
        if producer.kind() == "prim::Constant" and value.type().kind() == "BoolType":
            if producer.output().toIValue():
                return True
        elif value.type().kind() == "BoolType":
            return True  # not a constant: cannot tell
    return False


def _constant(value):
    """The value of a graph constant (a tensor or number), else ``None``."""
    if value.node().kind() != "prim::Constant":
        return None
    try:
        return value.toIValue()
    except RuntimeError:
        return None


def _is(value, number):
    """Whether a graph value is a constant equal to ``number`` everywhere."""
    c = _constant(value)
    if isinstance(c, bool) or c is None:
        return False
    if isinstance(c, (int, float)):
        return c == number
    return torch.is_tensor(c) and c.numel() > 0 and bool((c == number).all())


def _identity_input(node):
    """The input a node returns unchanged (same type, shape and strides), else ``None``."""
    kind = node.kind()
    if node.outputsSize() != 1:
        return None
    inputs = list(node.inputs())
    if kind in _IDENTITY_WHEN_SAME_TYPE:
        source = inputs[0]
        if kind == "aten::to" and _copies(node):
            return None
    elif kind == "aten::sum" and len(inputs) == 2:  # sum(x, dtype=None) of a 0-dim tensor
        source = inputs[0]
        t = source.type()
        if not (_complete(t) and t.sizes() == []) or _constant(inputs[1]) is not None:
            return None
    elif kind in ("aten::add", "aten::sub") and len(inputs) == 3 and _is(inputs[2], 1):
        if _is(inputs[1], 0):  # x + 0, x - 0
            source = inputs[0]
        elif kind == "aten::add" and _is(inputs[0], 0):  # 0 + x
            source = inputs[1]
        else:
            return None
    elif kind in ("aten::mul", "aten::div") and len(inputs) == 2 and _is(inputs[1], 1):
        source = inputs[0]  # x * 1, x / 1
    elif kind == "aten::mul" and len(inputs) == 2 and _is(inputs[0], 1):
        source = inputs[1]
    else:
        return None
    return source if _same_type(source.type(), node.output().type()) else None


def _drop_broadcasts(graph):
    """Read each *constant* input of a ``broadcast_tensors`` as a constant (itself, or itself
    expanded to the broadcast shape) instead of its broadcast, so that what is computed from
    it folds (e.g. the ``log`` of a fixed scale). The computed inputs keep their broadcast: with
    it, TorchScript's autodiff left ``softplus`` to eager autograd, and without it its symbolic
    gradient ``1 - exp(-y)`` lost 5 % at y = 1e-6 in float32 (measured;
    ``tests/infer/test_graph_passes.py``)."""
    dropped = 0
    for node in list(graph.nodes()):
        if node.kind() != "aten::broadcast_tensors":
            continue
        packed = node.inputsAt(0).node()
        uses = node.output().uses()
        if packed.kind() != "prim::ListConstruct" or len(uses) != 1:
            continue
        unpack = uses[0].user
        if unpack.kind() != "prim::ListUnpack":
            continue
        for source, result in zip(packed.inputs(), unpack.outputs(), strict=True):
            value = _constant(source)
            if not torch.is_tensor(value) or not _complete(result.type()):
                continue
            if _same_type(source.type(), result.type()):
                result.replaceAllUsesWith(source)
            else:  # a constant broadcast to the others' shape: that is a constant too
                sizes = result.type().sizes()
                expanded = value.expand(sizes)
                if list(expanded.stride()) != result.type().strides():
                    continue
                constant = graph.insertConstant(expanded)
                constant.node().moveBefore(node)
                result.replaceAllUsesWith(constant)
            dropped += 1
    return dropped


def _drop_identities(graph):
    """Replace each op that returns one of its inputs unchanged (an ``expand``/``reshape``/
    ``to`` to the type it has, ``x + 0``, ``x * 1``, the ``sum`` of a scalar) by that input."""
    dropped = 0
    for node in list(graph.nodes()):
        source = _identity_input(node)
        if source is None:
            continue
        node.output().replaceAllUsesWith(source)
        node.destroy()
        dropped += 1
    return dropped


def _fuse_linear_bias(graph):
    """``linear(x, W) + b`` (a bias vector added apart, as the local reparameterisation adds
    the bias's mean) becomes ``linear(x, W, b)``: one op, and one autograd node, fewer."""
    fused = 0
    for node in list(graph.nodes()):
        if node.kind() != "aten::add" or len(list(node.inputs())) != 3:
            continue
        out, bias, alpha = node.inputs()
        producer = out.node()
        if producer.kind() != "aten::linear" or len(out.uses()) != 1 or not _is(alpha, 1):
            continue
        if producer.inputsAt(2).type().kind() != "NoneType":
            continue
        t, b = out.type(), bias.type()
        if not (_complete(t) and _complete(b)) or len(b.sizes()) != 1:
            continue
        if b.sizes()[0] != t.sizes()[-1] or b.scalarType() != t.scalarType():
            continue
        if b.device() != t.device() or not _same_type(t, node.output().type()):
            continue
        if bias.node().kind() != "prim::Param" and not bias.node().isBefore(producer):
            continue
        producer.replaceInput(2, bias)
        node.output().replaceAllUsesWith(out)
        node.destroy()
        fused += 1
    return fused


def simplify(graph):
    """Simplify a traced graph in place (see the module docs); returns ``(ops before, ops
    after)``. Only for graphs from a trace: the peephole pass uses their complete shapes."""
    before = count_ops(graph)
    torch._C._jit_pass_peephole(graph, False)  # False: shape peepholes on (size() of a known shape)
    torch._C._jit_pass_constant_propagation(graph)
    _drop_broadcasts(graph)
    _drop_identities(graph)
    torch._C._jit_pass_dce(graph)
    torch._C._jit_pass_constant_propagation(graph)
    _drop_identities(graph)
    _fuse_linear_bias(graph)
    torch._C._jit_pass_cse(graph)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
    return before, count_ops(graph)

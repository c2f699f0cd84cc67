"""Simplify a traced loss graph before it first runs: fewer operations per training step.

Why: a trace of a Pyro loss records every tensor operation of one call, including the many
that act only on constants (a fixed prior's ``zeros(...) + scale``, its ``expand``, the
constant parts of a closed-form KL, the dropout rate's ``1 - p``) and the shape bookkeeping
of broadcasting (``aten::size`` → ``Int`` → ``NumToTensor`` chains, ``expand``/``reshape`` to
the shape a tensor already has). TorchScript's interpreter runs each of them on every step,
and autograd records each that touches a parameter. Measured on the speed benchmark's W1
workload (8-50-1, batch 32, ``AutoDropout``): 346 ``aten::`` ops as traced, 46 after
:func:`simplify`, with the same outputs for the same random stream, up to floating-point
rounding where linear ops are folded (tests in
``tests/infer/test_graph_passes.py``; the other guides: ``docs/benchmarks/speed.md``).

The passes are TorchScript's own (peephole with shape information, constant propagation,
common-subexpression elimination, dead-code elimination; none of them folds or merges a
random draw) plus five of ours: drop ops whose result has exactly the type, shape and strides
of an input (a trace's graph carries complete shapes, so this is known), read constants out of
broadcasts, merge a clamp of a clamp, add a bias vector inside the ``linear`` that produced its
operand, and fold trees of linear ops with constant coefficients (the likelihood's scaling and
offsets, the KL terms' sums, the loss's total) into one linear combination
(:func:`_fold_linear`; W1, ops as simplified before / after it: MC dropout 61 / 46, mean-field
73 / 61, VD 69 / 55, Concrete dropout 95 / 82).
"""

import torch

from .._trace import RANDOM_KINDS

__all__ = ["PASSES", "count_ops", "simplify"]

#: TorchScript's own passes that :func:`simplify` runs (``torch._C`` functions: internals,
#: looked up by ``traced.unavailable`` before a trace).
PASSES = (
    "_jit_pass_peephole",
    "_jit_pass_constant_propagation",
    "_jit_pass_dce",
    "_jit_pass_constant_pooling",
    "_jit_pass_cse",
)

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


#: Ops whose output may share memory with an input (an in-place write to it writes there too).
_VIEW_KINDS = frozenset(
    {
        "aten::expand",
        "aten::expand_as",
        "aten::reshape",
        "aten::view",
        "aten::select",
        "aten::slice",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::t",
        "aten::transpose",
        "aten::permute",
        "aten::narrow",
        "aten::as_strided",
        "aten::detach",
        "aten::alias",
        "aten::to",
        "aten::contiguous",
        "prim::ListConstruct",
        "prim::ListUnpack",
        "aten::broadcast_tensors",
    }
)


def _written_in_place(value, seen=None):
    """Whether an in-place op writes to ``value`` or to a view of it."""
    seen = set() if seen is None else seen
    if value.unique() in seen:
        return False
    seen.add(value.unique())
    for use in value.uses():
        user = use.user
        if user.kind().endswith("_"):
            return True
        if user.kind() in _VIEW_KINDS:
            if any(_written_in_place(out, seen) for out in user.outputs()):
                return True
    return False


def _drop_identities(graph):
    """Replace each op that returns one of its inputs unchanged (an ``expand``/``reshape``/
    ``to`` to the type it has, ``x + 0``, ``x * 1``, the ``sum`` of a scalar) by that input,
    unless its result is written in place (then it is a copy the write must not reach the
    input through)."""
    dropped = 0
    for node in list(graph.nodes()):
        source = _identity_input(node)
        if source is None or _written_in_place(node.output()):
            continue
        node.output().replaceAllUsesWith(source)
        node.destroy()
        dropped += 1
    return dropped


def _can_move_before(node, target):
    """Whether ``node`` (a pure op with one output, all of whose inputs are defined before
    ``target``) can move to just before ``target`` without changing what the graph computes."""
    kind = node.kind()
    if not kind.startswith("aten::") or kind.endswith("_") or node.outputsSize() != 1:
        return False
    if any(r in kind for r in RANDOM_KINDS):
        return False
    for value in node.inputs():
        source = value.node()
        if source.kind() != "prim::Param" and not source.isBefore(target):
            return False
    # An in-place op between the two places could write to what the node reads (through an
    # alias the graph does not show): moving the node would read the value before the write.
    for other in node.owningBlock().nodes():
        if other.kind().endswith("_") and not other.isBefore(target) and other.isBefore(node):
            return False
    return True


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
            if not _can_move_before(bias.node(), producer):
                continue
            bias.node().moveBefore(producer)  # e.g. a bias's variance, computed after it
        producer.replaceInput(2, bias)
        node.output().replaceAllUsesWith(out)
        node.destroy()
        fused += 1
    return fused


def _clamp_bound(value):
    """A clamp bound that is a constant: ``(True, number or None)``; else ``(False, None)``."""
    if value.type().kind() == "NoneType":
        return True, None
    c = _constant(value)
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return True, c
    return False, None


def _merge_clamps(graph):
    """``clamp(clamp(x, a1, b1), a2, b2)`` with constant bounds, the inner one used only there,
    becomes ``clamp(x, max(a1, a2), min(b1, b2))`` (where that interval is not empty): the
    same values, and the same gradient (1 exactly where both clamps pass ``x``). A drop rate
    meets two: Pyro's ``unit_interval`` transform clips its sigmoid, the guide keeps ``p``
    inside (eps, 1 - eps)."""
    merged = 0
    for node in list(graph.nodes()):
        if node.kind() != "aten::clamp" or node.inputsSize() != 3:
            continue
        inner_out = node.inputsAt(0)
        inner = inner_out.node()
        if inner.kind() != "aten::clamp" or inner.inputsSize() != 3 or len(inner_out.uses()) != 1:
            continue
        bounds = [_clamp_bound(v) for v in (inner.inputsAt(1), inner.inputsAt(2))]
        bounds += [_clamp_bound(v) for v in (node.inputsAt(1), node.inputsAt(2))]
        if not all(ok for ok, _ in bounds):
            continue
        (_, a1), (_, b1), (_, a2), (_, b2) = bounds
        lows = [a for a in (a1, a2) if a is not None]
        highs = [b for b in (b1, b2) if b is not None]
        low, high = (max(lows) if lows else None), (min(highs) if highs else None)
        if low is not None and high is not None and low > high:
            continue
        for i, bound in ((1, low), (2, high)):
            constant = graph.insertConstant(bound)
            constant.node().moveBefore(node)
            node.replaceInput(i, constant)
        node.replaceInput(0, inner.inputsAt(0))
        inner.destroy()
        merged += 1
    return merged


# -- linear folding -------------------------------------------------------------------------

#: Ops that are linear in their tensor inputs where their other inputs are constant numbers.
_LINEAR = frozenset({"aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div", "aten::neg"})
#: Shape-only ops, linear (the identity on values) where input and output hold one element.
_RESHAPES = frozenset({"aten::reshape", "aten::view", "aten::squeeze", "aten::unsqueeze"})


def _number(value):
    """A constant whose elements all equal one floating-point number: that number (a Python
    float), else ``None``. (A fixed prior's scale arrives as a tensor expanded to a shape.)"""
    c = _constant(value)
    if isinstance(c, bool) or c is None:
        return None
    if isinstance(c, (int, float)):
        return float(c)
    if not torch.is_tensor(c) or c.numel() == 0 or not c.dtype.is_floating_point:
        return None
    first = c.reshape(-1)[0]
    return float(first) if bool((c == first).all()) else None


def _numel(value):
    t = value.type()
    if not (isinstance(t, torch._C.TensorType) and t.sizes() is not None):
        return None
    n = 1
    for size in t.sizes():
        n *= size
    return n


def _linear_inputs(node):
    """For a linear node: ``[(input, coefficient), ...]`` and a constant ``c`` such that its
    output is ``sum(coefficient * input) + c`` (broadcast); else ``None``."""
    kind = node.kind()
    ins = list(node.inputs())
    if kind == "aten::neg" and len(ins) == 1:
        return [(ins[0], -1.0)], 0.0
    if kind in ("aten::add", "aten::sub", "aten::rsub") and len(ins) == 3:
        alpha = _number(ins[2])
        if not alpha:  # not a constant, or 0 (0 * b: a NaN in b must stay NaN)
            return None
        a, b = (ins[1], ins[0]) if kind == "aten::rsub" else (ins[0], ins[1])
        sign = 1.0 if kind == "aten::add" else -1.0
        terms, const = [], 0.0
        for value, coef in ((a, 1.0), (b, sign * alpha)):
            number = _number(value)
            if number is None:
                terms.append((value, coef))
            else:
                const += coef * number
        return (terms, const) if terms else None
    if kind in ("aten::mul", "aten::div") and len(ins) == 2:
        numbers = [_number(v) for v in ins]
        if kind == "aten::div":
            if numbers[0] is not None or not numbers[1]:
                return None
            return [(ins[0], 1.0 / numbers[1])], 0.0
        if (numbers[0] is None) == (numbers[1] is None):
            return None  # a product of two computed values, or of two constants
        i = 0 if numbers[1] is not None else 1
        if not numbers[1 - i]:
            return None  # x * 0 stays (it is NaN where x is)
        return [(ins[i], numbers[1 - i])], 0.0
    return None


def _sum_input(node):
    """For a ``sum`` with a one-element output (``sum(x)``, or over dims leaving one element),
    without a dtype: its input; else ``None``."""
    if node.kind() != "aten::sum" or _numel(node.output()) != 1:
        return None
    dtype = list(node.inputs())[-1]
    if dtype.type().kind() != "NoneType":
        return None
    return node.inputsAt(0)


class _Linear:
    """``sum(coef * term) + const``. A term is ``(value, False)``: the value itself,
    broadcast; ``(value, True)``: the sum of its elements; ``(_Combo, True)``: the sum of the
    elements of a linear combination of values."""

    def __init__(self, terms=None, const=0.0):
        self.terms = dict(terms or {})
        self.const = const

    def add(self, other, scale=1.0):
        for key, coef in other.terms.items():
            self.terms[key] = self.terms.get(key, 0.0) + scale * coef
        self.const += scale * other.const

    def items(self):
        """The terms, those whose coefficients cancelled to 0 included (a NaN or an infinity
        in them must still reach the result, as it did through the ops)."""
        return list(self.terms.items())


def _foldable(node):
    """Whether ``node`` is linear in its computed inputs (see ``_linear_inputs``), a sum to
    one element, or a reshape of one element."""
    kind = node.kind()
    if node.outputsSize() != 1 or _numel(node.output()) is None:
        return False
    if kind in _LINEAR:
        return _linear_inputs(node) is not None
    if kind in _RESHAPES:
        return _numel(node.output()) == 1 and _numel(node.inputsAt(0)) == 1
    return _sum_input(node) is not None


class _Combo:
    """``sum(coef * value)`` over values of one shape (or broadcasting to one), the first
    coefficient 1: summed as one tensor where summing each value apart would take a ``sum``
    and an ``add`` per value."""

    def __init__(self, terms):
        lead = next((i for i, (_, coef) in enumerate(terms) if coef != 0.0), 0)
        terms = [terms[lead]] + terms[:lead] + terms[lead + 1 :]
        first = terms[0][1] or 1.0
        self.terms = [(value, coef / first) for value, coef in terms]
        self.scale = first
        shape = ()
        for value, _ in terms:
            shape = torch.broadcast_shapes(shape, tuple(value.type().sizes()))
        self.sizes = list(shape)


def _values(form):
    """The graph values a form reads."""
    out = []
    for (term, _), _ in form.items():
        out.extend(v for v, _ in term.terms) if isinstance(term, _Combo) else out.append(term)
    return out


def _ordered(terms):
    """Terms with one of coefficient 1 first, where there is one (it needs no ``mul``)."""
    ones = [t for t in terms if t[1] == 1.0]
    return ones[:1] + [t for t in terms if t is not (ones[0] if ones else None)]


class _LinearFolder:
    """Rewrites each maximal tree of linear ops (each inner op's result used once, by the next)
    as one linear combination of the values it reads, where that takes fewer ops: ``mul`` /
    ``add`` with ``alpha``, a ``sum`` per summed value (or per summed combination), one
    ``add`` for the constant."""

    def __init__(self, graph):
        self.graph = graph
        self.folded = 0

    def _inner(self, value):
        """Whether ``value`` is produced by a foldable op and used only by one foldable op."""
        uses = value.uses()
        return _foldable(value.node()) and len(uses) == 1 and _foldable(uses[0].user)

    def _form(self, value, nodes):
        if self._inner(value):
            return self._expand(value.node(), nodes)
        return _Linear({(value, False): 1.0})

    def _expand(self, node, nodes):
        """The linear form of ``node``'s output in terms of values outside its tree (``nodes``
        collects the tree's ops); ``None`` where a shape rules it out."""
        nodes.append(node)
        source = _sum_input(node)
        if source is not None:
            return self._sum_all(source, nodes)
        if node.kind() in _RESHAPES:
            return self._form(node.inputsAt(0), nodes)
        terms, const = _linear_inputs(node)
        out = _Linear(const=const)
        for value, coef in terms:
            inner = self._form(value, nodes)
            if inner is None:
                return None
            out.add(inner, coef)
        return out

    def _sum_all(self, value, nodes):
        """The linear form of the sum of all of ``value``'s elements (``value`` read only by
        the sum this stands for). A sum over some dims that only this sum reads is looked
        through (``sum(sum(x, dims)) = sum(x)``), as are the linear ops that make ``value``."""
        producer = value.node()
        if (
            producer.kind() == "aten::sum"
            and producer.outputsSize() == 1
            and list(producer.inputs())[-1].type().kind() == "NoneType"
            and len(value.uses()) == 1
        ):
            nodes.append(producer)
            return self._sum_all(producer.inputsAt(0), nodes)
        n = _numel(value)
        if n is None:
            return None
        if not (_foldable(producer) and len(value.uses()) == 1):
            return _Linear({(value, True): 1.0})
        inner = self._expand(producer, nodes)
        if inner is None:
            return None
        out = _Linear(const=inner.const * n)
        elementwise = []
        for (term, summed), coef in inner.items():
            if summed:  # a scalar, broadcast to n elements
                out.add(_Linear({(term, True): 1.0}), coef * n)
            else:
                elementwise.append((term, coef))
        if not elementwise:
            return out
        if any(not _complete(v.type()) for v, _ in elementwise):
            return None
        if len(elementwise) == 1:
            (term, coef), m = elementwise[0], _numel(elementwise[0][0])
            total = self._sum_all(term, nodes) if n % m == 0 else None
            if total is None:
                return None
            out.add(total, coef * (n // m))
            return out
        combo = _Combo(elementwise)
        m = 1
        for size in combo.sizes:
            m *= size
        if n % m:
            return None
        out.terms[(combo, True)] = combo.scale * (n // m)
        return out

    def _cost(self, form):
        """Ops to compute ``form`` (see :meth:`_emit`)."""
        terms = _ordered(form.items())
        if not terms:
            return None
        n = (terms[0][1] != 1.0) + (len(terms) - 1) + (form.const != 0.0)
        for (term, summed), _ in terms:
            if isinstance(term, _Combo):
                n += len(term.terms) + (term.terms[0][1] != 1.0)  # its ops and its sum
            elif summed and term.type().sizes() != []:
                n += 1
        return n

    def _emit(self, root, form):
        graph = self.graph
        out_type = root.output().type()

        def insert(kind, inputs, sizes):
            node = graph.create(kind, inputs, 1)
            node.insertBefore(root)
            node.output().setType(out_type.with_sizes(list(sizes)))
            return node.output()

        def constant(value):
            c = graph.insertConstant(value)
            c.node().moveBefore(root)
            return c

        def combine(terms, const=0.0):
            (first, coef), rest = terms[0], terms[1:]
            sizes = first.type().sizes()
            cur = first if coef == 1.0 else insert("aten::mul", [first, constant(coef)], sizes)
            for value, coef in rest:
                sizes = torch.broadcast_shapes(tuple(sizes), tuple(value.type().sizes()))
                cur = insert("aten::add", [cur, value, constant(coef)], sizes)
            if const != 0.0:
                cur = insert("aten::add", [cur, constant(const), constant(1)], sizes)
            return cur

        terms = []
        for (term, summed), coef in _ordered(form.items()):
            if isinstance(term, _Combo):
                term = combine(term.terms)
            if summed and term.type().sizes() != []:
                term = insert("aten::sum", [term, constant(None)], [])
            terms.append((term, coef))
        return combine(terms, form.const)

    def run(self):
        for root in list(self.graph.nodes()):
            if not _foldable(root) or self._inner(root.output()):
                continue
            nodes = []
            form = self._expand(root, nodes)
            if form is None or len(nodes) < 2:
                continue
            cost = self._cost(form)
            if cost is None or cost >= len(nodes):
                continue
            out = root.output()
            t = out.type()
            values = _values(form)
            if not _complete(t) or t.scalarType() not in ("Float", "Double", "Half", "BFloat16"):
                continue
            if any(not _complete(v.type()) for v in values):
                continue
            if any(v.type().scalarType() != t.scalarType() for v in values):
                continue
            if any(v.type().device() != t.device() for v in values):
                continue
            if any(_written_in_place(v) for v in values):
                continue  # the tree reads them at its ops' places; the rewrite at the root's
            shape = ()
            for (term, summed), _ in form.items():
                shape = torch.broadcast_shapes(shape, () if summed else tuple(term.type().sizes()))
            if list(shape) != t.sizes():
                continue  # the terms alone would not give the result's shape
            new = self._emit(root, form)
            out.replaceAllUsesWith(new)
            for node in nodes:  # root first: users before producers
                node.destroy()
            self.folded += 1
        return self.folded


def _fold_linear(graph):
    """Fold each tree of linear ops with constant coefficients (``x * c``, ``x / c``, ``-x``,
    ``a + b``, ``a - c``, full ``sum``s, one-element reshapes) into a linear combination of
    the values it reads: ``sum(c_i * v_i) + c`` as ``add(…, v_i, alpha=c_i)``. The likelihood's
    ``-(y - f)² / 2σ² - log σ - log √2π``, summed and scaled by N / B, and the KL terms that
    are added to it become a few ops; constant offsets merge into one. Same values up to
    floating-point rounding, same gradients (linear maps)."""
    return _LinearFolder(graph).run()


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
    _merge_clamps(graph)
    torch._C._jit_pass_constant_pooling(graph)  # constants first: the bias fusion moves ops
    _fuse_linear_bias(graph)
    torch._C._jit_pass_cse(graph)
    _fold_linear(graph)
    torch._C._jit_pass_dce(graph)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)
    return before, count_ops(graph)

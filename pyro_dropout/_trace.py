"""What a KL or a graph pass may know about a tensor of a TorchScript trace being recorded."""

import torch

__all__ = ["RANDOM_KINDS", "known_zero", "traced_constant", "tracing"]

#: Substrings of the kinds of TorchScript nodes that draw random numbers: such a value is not a
#: constant, and such a node must not be moved (the random stream's order).
RANDOM_KINDS = (
    "rand",
    "normal",
    "bernoulli",
    "uniform",
    "poisson",
    "multinomial",
    "exponential",
    "dropout",
)


def tracing():
    """Whether a TorchScript trace is being recorded (``False`` in a torch without
    TorchScript's tracer: then none can be)."""
    state = getattr(torch._C, "_get_tracing_state", None)
    return state is not None and state() is not None


def traced_constant(t):
    """Whether ``t``, in the trace being recorded, is computed from constants only (no input
    of the trace, no random draw): its value is then baked into the graph, so branching on it
    is exactly as valid as the trace itself."""
    try:
        # Private API (torch.jit's tracer): where it is missing or moved, say "cannot tell".
        todo, seen = [torch._C._get_value_trace(t)], set()
    except Exception:
        return False
    while todo:
        value = todo.pop()
        if value.unique() in seen:
            continue
        seen.add(value.unique())
        kind = value.node().kind()
        if kind == "prim::Param" or any(r in kind for r in RANDOM_KINDS):
            return False
        todo.extend(value.node().inputs())
    return True


def known_zero(t):
    """Whether ``t`` is zero everywhere and no gradient or later input can change that: a
    prior's mean, say, for which a KL can skip a pass over the weight. ``False`` when it cannot
    tell cheaply (a tensor that requires grad, an input of a trace, a tensor on an accelerator
    outside a trace, where reading it would synchronise every step)."""
    if t.requires_grad:
        return False
    if tracing():
        if not traced_constant(t):
            return False
        state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)  # read a constant's value without recording it
        try:
            return not bool(t.any())
        finally:
            torch._C._set_tracing_state(state)
    return t.device.type == "cpu" and not bool(t.any())

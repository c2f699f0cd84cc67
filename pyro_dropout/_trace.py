"""What a KL may know about a tensor cheaply, and whether a loss capture is recording.

The capture (:mod:`pyro_dropout.infer.capture`) registers its recorder here, a layer below the
distributions that ask (they must not import ``infer``)."""

__all__ = ["ACTIVE", "constant_in_capture", "known_zero"]

#: The recorders of the captures running (innermost last); each has ``dynamic``, the ids of
#: the tensors that depend on an input or a draw.
ACTIVE: list = []


def constant_in_capture(t):
    """Inside a capture: whether ``t`` is a constant of the graph being recorded (it depends
    on no input and no draw), so that reading its value into Python is valid for every replay.
    ``None`` outside a capture."""
    if not ACTIVE:
        return None
    return id(t) not in ACTIVE[-1].dynamic


def known_zero(t):
    """Whether ``t`` is zero everywhere and no gradient or later input can change that: a
    prior's mean, say, for which a KL can skip a pass over the weight. ``False`` when it cannot
    tell cheaply (a tensor that requires grad, an input of a loss being captured or computed
    from one, a tensor on an accelerator outside a capture, where reading it would synchronise
    every step)."""
    if t.requires_grad:
        return False
    constant = constant_in_capture(t)
    if constant is not None:  # inside a capture: a constant's value is read once
        return constant and not bool(t.any())
    return t.device.type == "cpu" and not bool(t.any())

"""Registry of local-reparameterisation rules, keyed by weight distribution family."""

__all__ = ["register_local_reparameterization", "lookup_rule"]

_RULES = {}


def register_local_reparameterization(family):
    """Register the pre-activation sampler for a weight distribution family.

    The decorated function is called as ``rule(fn, x, spec)`` with the guide distribution
    ``fn`` of the weight (``Independent`` wrappers removed), the layer input ``x`` and the
    layer's :class:`~pyro_dropout.nn.functional.LinearSpec` / ``ConvSpec``; it returns one
    sample of ``spec(x, W)`` (without bias) for ``W ~ fn``, drawn independently per example.
    Dispatch follows the class hierarchy, like :func:`torch.distributions.kl.register_kl`.

    Example::

        @register_local_reparameterization(MyFamily)
        def _lrt_my_family(fn, x, spec):
            return spec(x, fn.loc)   # a deterministic family
    """

    def decorator(rule):
        _RULES[family] = rule
        return rule

    return decorator


def lookup_rule(fn):
    """The rule registered for the most specific class of ``fn``, or None."""
    for cls in type(fn).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    return None

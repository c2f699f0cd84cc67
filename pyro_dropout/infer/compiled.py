"""``MeanFieldELBO`` captured once per input signature and replayed, checked, and eager where it
cannot be captured.

How: :mod:`pyro_dropout.infer.capture` records the loss's tensor operations with torch's public
``TorchFunctionMode`` and replays them as a ``torch.fx`` graph (public APIs only). Why not
TorchScript tracing, which did this until 0.1: it is deprecated upstream, and the fast path
went through its internals; why not ``torch.compile`` or ``torch.export``: measured on the speed
benchmark's W1 loss (8-50-1, batch 32, one CPU thread, torch 2.13), ``torch.compile`` took 47 s
and split it into 21 graphs (Dynamo breaks on Pyro's effect handlers), ``torch.export`` 3.6 s
and could not build the tensor subclass that routes guided weights; a capture takes ~0.05 s.
Where a loss cannot be captured, it runs eagerly with one :class:`CompilationWarning`.
"""

import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from pyro.infer.util import torch_item
from pyro.poutine.runtime import _PYRO_STACK
from pyro.util import warn_if_nan

from ..handlers.lrt_messenger import _user_stacklevel
from .capture import CapturedFunction
from .compile_warning import CompilationWarning
from .mean_field_elbo import MeanFieldELBO

__all__ = ["CompilationWarning", "JitMeanFieldELBO"]

#: Distinct input signatures compiled before a ``fallback`` ELBO stops compiling: inputs whose
#: shape changes at (nearly) every step would pay a trace each time.
MAX_SIGNATURES = 16

#: What running eagerly costs, for the warning: fit's eager step against its compiled step on
#: the speed page's W1 workload (8-50-1, batch 32; ``docs/benchmarks/speed.md`` at 790d6bc).
EAGER_COST = "steps 3.7-5.5x slower on small networks (the speed page's W1 workload)"


class _Eager(Exception):
    """Internal: this signature runs eagerly (the reason is in the message)."""


def _signature(value):
    """Hashable description of one argument: tensors by shape, dtype and device (a trace
    bakes shapes into the graph), other values by themselves."""
    if isinstance(value, torch.Tensor):
        # (torch.Size and torch.device hash and compare by value; no tuple of either is an
        # argument's own value)
        return (value.shape, value.dtype, value.device)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"JitMeanFieldELBO: cannot compile for an argument of type {type(value).__name__}; "
        "pass tensors, numbers, strings or None (or use MeanFieldELBO)"
    )


def _jit_key(obj, default):
    """``obj.jit_key`` (what a compiled loss depends on), ``default`` where its class has none.
    Looked up on the class first: on a guide (a ``PyroModule``) a missing attribute goes through
    ``PyroModule.__getattr__`` and an ``AttributeError``, microseconds paid at every step."""
    return obj.jit_key if hasattr(type(obj), "jit_key") else default


def _cuda_devices(args, kwargs):
    """CUDA devices of the tensor arguments (whose random streams a trace must not move)."""
    values = list(args) + list(kwargs.values())
    return sorted({v.device.index or 0 for v in values if torch.is_tensor(v) and v.is_cuda})


def _graph_text(fn):
    """What a captured function recorded (calls, shapes, the Python values they took)."""
    return fn.captured.text


class JitMeanFieldELBO(MeanFieldELBO):
    r""":class:`MeanFieldELBO` captured and replayed (:mod:`pyro_dropout.infer.capture`): after
    the first steps of each input signature, a step runs one ``torch.fx`` graph of the loss's
    tensor operations without Pyro's Python-level effect handling (faster steps on small
    networks; see ``docs/benchmarks/speed.md``). ``fit(..., jit="auto")`` trains with it.

    **Checked.** A capture records the operations of one call; Python control flow that depends
    on the data or on random draws (``if x.mean() > 0``, a value read with ``.item()``) would be
    frozen into it. So each signature is captured twice, on its first two calls (normally two
    different minibatches), and the two records must be identical (the calls, shapes and the
    Python values they took). A model whose record changes is data dependent: with
    ``fallback=True`` it then runs eagerly from that step on, with one
    :class:`CompilationWarning` that says why; otherwise a ``RuntimeError`` says so. The check
    cannot see a branch that takes the same side on both minibatches, nor Python side effects
    (e.g. a model appending to a list, or reading a global that changes between steps). Each
    capture is also replayed once against the call it recorded (outputs and gradients).

    **Fallback.** With ``fallback=True`` (``fit(..., jit="auto")``), a model that cannot
    be captured (an argument of another type, an operation outside torch's Python API, a model
    whose record changes), or whose inputs take more than :data:`MAX_SIGNATURES` shapes, runs
    eagerly with one :class:`CompilationWarning` naming the reason: the same loss, slower steps.
    With ``fallback=False`` (``jit=True``) these are errors.

    Why not Pyro's ``JitTraceMeanField_ELBO``: it traces with TorchScript (deprecated upstream),
    in Pyro 1.9 it re-creates its compiled function on every call (it caches under a different
    attribute name than it tests), so it retraces each step (measured 55 ms per step instead of
    1.2 ms), and its cache ignores the shapes of tensor arguments, which a trace bakes in.
    Here one graph is kept per (model, guide, argument shapes/dtypes/devices, non-tensor
    arguments, active Pyro handlers) and reused; the graphs belong to this ELBO and are freed
    with it.

    Requirements (as for any Pyro JIT ELBO): tensor inputs are passed as arguments, and nothing
    else the model and guide read changes between steps except Pyro parameters (e.g. a fixed
    likelihood precision is baked into the graph; build a new ELBO after changing it). Argument
    validation runs on the first, eager call of each signature. ``ignore_jit_warnings`` and
    ``jit_options`` are accepted for compatibility with Pyro's JIT ELBOs and have no effect.
    """

    def __init__(
        self,
        *args: Any,
        ignore_jit_warnings: bool = True,
        jit_options: dict[str, Any] | None = None,
        fallback: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.ignore_jit_warnings = ignore_jit_warnings
        self.jit_options = jit_options
        self.fallback = fallback
        #: Why this ELBO runs eagerly (``None`` while it compiles).
        self.eager_reason = None
        self._compiled: dict = {}  # key -> [compiled function, number of calls]

    # -- compilation ------------------------------------------------------------------------
    def _key(self, model, guide, args, kwargs, terms, inner=()):
        """The graph's key for a call under the active Pyro handlers and then those whose
        keys are ``inner`` (as if entered: :class:`~pyro_dropout.infer.CompiledSVI` asks for
        the graph ``SVI.step`` would call, under its trace, without entering one)."""
        return (
            terms,
            torch.is_grad_enabled(),  # a trace under no_grad records no gradient graph
            id(model),
            id(guide),
            tuple(_signature(a) for a in args),
            tuple(sorted((k, _signature(v)) for k, v in kwargs.items())),
            tuple(_jit_key(m, type(m)) for m in _PYRO_STACK) + inner,
            # e.g. AutoConcreteDropout: relaxed masks in training, hard ones under no_grad
            _jit_key(guide, None),
            # and in eval mode: also where it sits inside a guide without a jit_key (an
            # AutoGuideList), whose train()/eval() it follows
            getattr(guide, "training", None),
        )

    def _trace(self, model, guide, terms):
        weakself = weakref.ref(self)
        # One graph per output: the loss alone, or (loss, data, kl) for logging.
        method = MeanFieldELBO.loss_terms if terms else MeanFieldELBO.differentiable_loss

        def loss(*args, **kwargs):
            return method(weakself(), model, guide, *args, **kwargs)

        return CapturedFunction(loss)

    def _run(self, model, guide, args, kwargs, terms):
        """The compiled call (tracing on the first two calls of a signature, see the class
        docs); raises :class:`_Eager` where this call has to run eagerly."""
        try:
            key = self._key(model, guide, args, kwargs, terms)
        except TypeError as err:
            if not self.fallback:
                raise
            raise _Eager(str(err).replace("JitMeanFieldELBO: cannot", "cannot")) from None
        entry = self._compiled.get(key)
        if entry is None and self.fallback and len(self._compiled) >= MAX_SIGNATURES:
            raise _Eager(
                f"the inputs took more than {MAX_SIGNATURES} shapes (each needs its own trace); "
                "pad or drop the last minibatch to keep one shape"
            )
        calls = 0 if entry is None else entry[1]
        if calls < 2:  # trace (again): the second trace checks the first
            fn = self._trace(model, guide, terms)
            try:
                # Capturing runs the model and guide eagerly (twice: parameters, then the
                # record) and leaves the random stream untouched, so that every step draws
                # exactly what its graph draws: a run resumed from a checkpoint repeats the
                # uninterrupted one.
                with torch.random.fork_rng(devices=_cuda_devices(args, kwargs)):
                    self._call(fn, args, kwargs)
            except Exception as err:  # noqa: BLE001 - any tracing failure: run eagerly instead
                if not self.fallback:
                    raise
                raise _Eager(f"capturing failed with {type(err).__name__}: {err}") from err
            if entry is not None and _graph_text(fn) != _graph_text(entry[0]):
                msg = (
                    "the captured graph differs between two minibatches of the same shape: the "
                    "model or guide has Python control flow or constants that depend on the "
                    "data or on random draws (e.g. `if x.mean() > 0`, `.item()`)"
                )
                if not self.fallback:
                    raise RuntimeError(f"JitMeanFieldELBO: {msg}; use jit=False")
                raise _Eager(msg)
            self._compiled[key] = entry = [fn, calls + 1]
        else:
            entry[1] += 1
        return self._call(entry[0], args, kwargs)

    @staticmethod
    def _call(fn, args, kwargs):
        return fn(*args, **kwargs)

    def _eager(self, reason):
        self.eager_reason = reason
        self._compiled.clear()
        warnings.warn(
            f"pyro_dropout: the loss is not compiled ({reason}); training continues eagerly: the "
            f"same loss, {EAGER_COST}. Pass jit=False to train eagerly without this warning.",
            CompilationWarning,
            stacklevel=_user_stacklevel(sys._getframe()),  # the user's fit or SVI.step line
        )

    def _dispatch(self, model, guide, args, kwargs, terms):
        method = MeanFieldELBO.loss_terms if terms else MeanFieldELBO.differentiable_loss
        if self.eager_reason is None:
            try:
                return self._run(model, guide, args, kwargs, terms)
            except _Eager as reason:
                # Eager first: a model that fails eagerly too raises its own error, unwarned.
                out = method(self, model, guide, *args, **kwargs)
                self._eager(str(reason))
                return out
        return method(self, model, guide, *args, **kwargs)

    def checked_graph(
        self,
        model: Callable[..., Any],
        guide: Callable[..., Any],
        args: tuple,
        kwargs: dict[str, Any],
        inner: tuple = (),
    ) -> tuple[Callable[..., Any], list[str]] | None:
        """``(graph, param_names)`` of this call's compiled loss where its signature has been
        captured and checked (its graph takes the unconstrained values of ``param_names``, then
        ``args``), else ``None`` (not compiled yet, eager, or a signature it cannot compile).
        ``inner``: the keys of handlers the call would run under inside the active ones. For
        :class:`~pyro_dropout.infer.CompiledSVI`, which calls the graph itself."""
        if self.eager_reason is not None:
            return None
        try:
            key = self._key(model, guide, args, kwargs, False, inner)
        except TypeError:
            return None
        entry = self._compiled.get(key)
        if entry is None or entry[1] < 2:
            return None
        fn = entry[0]
        return fn.captured, fn.param_names

    # -- the ELBO interface -----------------------------------------------------------------
    def differentiable_loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        return self._dispatch(model, guide, args, kwargs, terms=False)

    def loss_terms(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._dispatch(model, guide, args, kwargs, terms=True)

    def loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        loss = torch_item(loss)
        warn_if_nan(loss, "loss")
        return loss

"""Pyro's JIT (:func:`pyro.ops.jit.trace`) with graphs that are freed with their owner.

Why not ``pyro.ops.jit.trace`` itself: it traces a *function* with ``torch.jit.trace``, which
registers the graph in TorchScript's global compilation unit for the life of the process
(measured ~44 MB per compiled fit of a 20-200-200-1 network; a process running many compiled
fits grew by GBs). ``torch.jit.trace`` takes no compilation unit for functions, and for
modules it ignores the one it is given (torch 2.13/2.14: ``TracedModule`` re-creates the module
in the global unit). Here the same parameter plumbing as Pyro's
:class:`~pyro.ops.jit.CompiledFunction` records the trace as the ``forward`` method of a script
module that owns a compilation unit of its own (what ``torch.jit.trace`` does inside, with the
global unit), so the graph goes when the compiled function is dropped.

These are TorchScript internals, and TorchScript is deprecated upstream. This module is
imported only when a loss is compiled (never by ``import pyro_dropout``), and what it needs is
looked up before each first trace (:func:`unavailable`), so another torch degrades in steps,
each with one warning: without the internals (or where one has another signature), the
public ``torch.jit.trace`` (``check_trace=False``, as Pyro traces; the graph unsimplified and
kept for the life of the process); without that too, the loss runs eagerly
(:mod:`pyro_dropout.infer.compiled`). ``tests/infer/test_durable.py`` removes each in turn.
"""

import warnings
import weakref

import pyro
import pyro.poutine as poutine
import torch
from pyro.ops.jit import CompiledFunction, _hashable_args_kwargs
from pyro.util import ignore_jit_warnings

from . import graph_passes
from .compile_warning import CompilationWarning

__all__ = ["OwnedCompiledFunction", "trace", "unavailable"]


def _name_lookup():
    """TorchScript's name-lookup function for a trace, or ``None`` where this torch lacks it."""
    try:
        from torch.jit._trace import _create_interpreter_name_lookup_fn
    except ImportError:
        return None
    return _create_interpreter_name_lookup_fn


def _missing_internals():
    """The TorchScript internals :class:`_OwnedTrace` uses that this torch lacks (names)."""
    c = torch._C
    missing = [f"torch._C.{n}" for n in ("ScriptModule", "CompilationUnit") if not hasattr(c, n)]
    if hasattr(c, "ScriptModule") and not hasattr(c.ScriptModule, "_create_method_from_trace"):
        missing.append("ScriptModule._create_method_from_trace")
    if _name_lookup() is None:
        missing.append("torch.jit._trace._create_interpreter_name_lookup_fn")
    missing += [f"torch._C.{n}" for n in graph_passes.PASSES if not hasattr(c, n)]
    return missing


def unavailable():
    """Why no loss can be traced in this torch (a sentence), or ``None`` where one can."""
    if _missing_internals() and not callable(getattr(torch.jit, "trace", None)):
        return "this torch has no TorchScript tracer (torch.jit.trace nor its internals)"
    return None


class _OwnedTrace:
    """A traced function in a compilation unit of its own (freed with this object), its graph
    simplified (:mod:`pyro_dropout.infer.graph_passes`) before it first runs. ``text`` is the
    graph as traced (ops, shapes and constants, without source locations), for comparing two
    traces: the simplified graph would hide the values of folded tensor constants."""

    def __init__(self, fn, example_inputs):
        self._module = torch._C.ScriptModule(
            "__torch__.PyroDropoutLoss", torch._C.CompilationUnit(), True
        )
        names = [f"input{i}" for i in range(len(example_inputs))]
        self._module._create_method_from_trace(
            "forward",
            fn,
            tuple(example_inputs),
            _name_lookup()(0),
            False,  # strict: outputs may be tuples of tensors
            False,  # _force_outplace
            names,
            False,  # _store_inputs
        )
        self._forward = self._module._get_method("forward")
        self.text = self._forward.graph.str(False)
        self.ops = graph_passes.simplify(self._forward.graph)

    @property
    def graph(self):
        return self._forward.graph

    def __call__(self, *inputs):
        return self._forward(*inputs)


def _trace_owned(fn, example_inputs, jit_options):
    """``torch.jit.trace(fn, example_inputs)``, in a compilation unit of its own where torch
    allows it (see the module docs)."""
    global _fallback_warned
    if jit_options:  # the caller's own tracer options: the public tracer takes them
        return torch.jit.trace(fn, example_inputs, **jit_options)
    missing = _missing_internals()
    if not missing:
        try:
            return _OwnedTrace(fn, example_inputs)
        except (AttributeError, TypeError) as err:  # an internal gone or with another signature
            missing = [f"{type(err).__name__}: {err}"]  # (a model's own error recurs below)
    # check_trace=False as Pyro traces: a check would re-run the loss and compare random draws.
    out = torch.jit.trace(fn, example_inputs, check_trace=False)
    if not _fallback_warned:  # only once it worked: a failure is the eager warning's to say
        _fallback_warned = True
        warnings.warn(
            f"pyro_dropout: this torch lacks TorchScript internals the compiled loss uses "
            f"({', '.join(missing)}); compiling with the public torch.jit.trace instead: the "
            "graph is not simplified (slower steps) and stays in TorchScript's global "
            "compilation unit for the life of the process (~44 MB per fit of a 20-200-200-1 "
            "network)",
            CompilationWarning,
            stacklevel=3,
        )
    return out


_fallback_warned = False


class OwnedCompiledFunction(CompiledFunction):
    """:class:`pyro.ops.jit.CompiledFunction` whose traces live in their own compilation units
    (see the module docs). ``compiled`` maps each argument key to the traced callable; its
    ``graph`` is the traced graph."""

    def __call__(self, *args, **kwargs):
        key = _hashable_args_kwargs(args, kwargs)
        if key not in self.compiled:
            # Pyro's parameter capture, unchanged: the first call creates the params.
            with poutine.block():
                with poutine.trace(param_only=True) as first_param_capture:
                    self.fn(*args, **kwargs)
            # Sorted, not Pyro's list(set(...)): the order of the graph's inputs must not vary
            # between two traces of one signature (their graphs are compared; a set's order
            # changed between traces 1 run in 3 in the test suite).
            self._param_names = sorted(set(first_param_capture.trace.nodes.keys()))
            unconstrained = tuple(pyro.param(name).unconstrained() for name in self._param_names)
            params_and_args = unconstrained + args
            weakself = weakref.ref(self)

            def compiled(*params_and_args):
                self = weakself()
                n = len(self._param_names)
                constrained = {name: pyro.param(name) for name in self._param_names}
                for name, value in zip(self._param_names, params_and_args[:n], strict=True):
                    assert constrained[name].unconstrained() is value
                return poutine.replay(self.fn, params=constrained)(*params_and_args[n:], **kwargs)

            if self.ignore_warnings:
                compiled = ignore_jit_warnings()(compiled)
            options = {k: v for k, v in self.jit_options.items() if k != "time_compilation"}
            if options.get("check_trace") is False:
                del options["check_trace"]  # Pyro's default; the owned trace never checks
            with pyro.validation_enabled(False):
                self.compiled[key] = _trace_owned(compiled, params_and_args, options)
        else:
            params_and_args = [pyro.param(name).unconstrained() for name in self._param_names]
            params_and_args += list(args)

        with poutine.block(hide=self._param_names):
            with poutine.trace(param_only=True) as param_capture:
                ret = self.compiled[key](*params_and_args)
        for name in param_capture.trace.nodes.keys():
            if name not in self._param_names:
                raise NotImplementedError(
                    "pyro.ops.jit.trace assumes all params are created on "
                    f"first invocation, but found new param: {name}"
                )
        return ret


def trace(fn, ignore_warnings=False, jit_options=None):
    """:func:`pyro.ops.jit.trace` whose graphs are freed with the returned object."""
    return OwnedCompiledFunction(fn, ignore_warnings=ignore_warnings, jit_options=jit_options)

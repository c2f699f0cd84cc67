"""Pyro's JIT (:func:`pyro.ops.jit.trace`) with graphs that are freed with their owner.

Why not ``pyro.ops.jit.trace`` itself: it traces a *function* with ``torch.jit.trace``, which
registers the graph in TorchScript's global compilation unit for the life of the process
(measured ~44 MB per compiled fit of a 20-200-200-1 network; a process running many compiled
fits grew by GBs). ``torch.jit.trace`` takes no compilation unit for functions, and for
modules it ignores the one it is given (torch 2.13/2.14: ``TracedModule`` re-creates the module
in the global unit). Here the same parameter plumbing as Pyro's
:class:`~pyro.ops.jit.CompiledFunction` records the trace as the ``forward`` method of a script
module that owns a compilation unit of its own (what ``torch.jit.trace`` does inside, with the
global unit), so the graph goes when the compiled function is dropped. Where that internal API
is missing (another torch), it falls back to ``torch.jit.trace`` and says so once.
"""

import warnings
import weakref

import pyro
import pyro.poutine as poutine
import torch
from pyro.ops.jit import CompiledFunction, _hashable_args_kwargs
from pyro.util import ignore_jit_warnings
from torch.jit._trace import _create_interpreter_name_lookup_fn

from . import graph_passes

__all__ = ["OwnedCompiledFunction", "trace"]


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
            _create_interpreter_name_lookup_fn(0),
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
    if not jit_options:
        try:
            return _OwnedTrace(fn, example_inputs)
        except (AttributeError, TypeError) as err:  # torch without this internal API
            if not _fallback_warned:
                _fallback_warned = True
                warnings.warn(
                    f"pyro_dropout: traces stay in TorchScript's global compilation unit ({err})",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return torch.jit.trace(fn, example_inputs, **jit_options)


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

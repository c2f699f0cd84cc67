"""``pyro.infer.SVI`` whose steps call a compiled loss's graph directly once it is checked.

Why: at small sizes the Python around a compiled step costs as much as the step. Measured on
the speed benchmark's W1 workload (8-50-1, batch 32, ``AutoDropout``, one CPU thread, with the
TorchScript graphs of 0.1): the loss's forward and backward took 0.47 ms, the same through
Pyro's JIT plumbing (its ``pyro.param`` lookups through the effect stack, ``block`` and
``trace`` handlers, the cache key) 0.57 ms, through
:class:`~pyro_dropout.infer.JitMeanFieldELBO` 0.62 ms, and a whole ``SVI.step`` (its
``param_only`` trace, the optimiser, zeroing gradients) 0.90 ms; a plain ``nn.Dropout`` step
took 0.37 ms. :class:`CompiledSVI` takes Pyro's path for the steps that capture and check a
signature, then calls the checked graph with the parameters' unconstrained tensors read from
the param store, and steps the optimiser on exactly the parameters SVI's trace would have
collected: the graph's.
"""

from collections.abc import Callable
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.infer import ELBO, SVI
from pyro.infer.util import torch_item
from pyro.optim import PyroOptim
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.util import warn_if_nan

from .compiled import JitMeanFieldELBO
from .cuda_graph import StepGraphs
from .optim import FusedOptim

__all__ = ["CompiledSVI"]


class CompiledSVI(SVI):
    """Drop-in for :class:`pyro.infer.SVI` (same arguments, same steps) that is faster with
    :class:`~pyro_dropout.infer.JitMeanFieldELBO` and
    :class:`~pyro_dropout.infer.FusedOptim`, as :func:`~pyro_dropout.infer.fit` trains.

    A step whose input signature is traced and checked (from its third call on; see
    :class:`~pyro_dropout.infer.JitMeanFieldELBO`) runs the checked graph on the parameters'
    unconstrained values, backpropagates, steps the optimiser on those parameters (the ones
    ``SVI.step`` would collect) and clears their gradients (to ``None``, as
    ``torch.optim.Optimizer.zero_grad`` does; Pyro's ``SVI`` sets them to zeros). Every other
    step is ``SVI.step``'s (the same loss, trace and optimiser step), its gradients cleared by
    :meth:`~pyro_dropout.infer.FusedOptim.clear_grads` where the optimiser is one; any other
    optimiser's step is ``SVI.step`` itself. (Where the optimiser's flat Adam steps, the
    gradients are zeroed in place instead: views of its buffer.)

    ``cuda_graph=True``: on a GPU, each checked step (the graph, backward, the flat Adam
    update, the gradient reset) is recorded once as a CUDA graph and replayed, and every step
    runs on one side stream per device (see :mod:`pyro_dropout.infer.cuda_graph`).

    Example::

        svi = CompiledSVI(model, guide, fused_adam({"lr": 1e-3}), JitMeanFieldELBO())
        for step in range(1000):
            svi.step(x, y)
    """

    def __init__(
        self,
        model: Callable[..., Any],
        guide: Callable[..., Any],
        optim: PyroOptim,
        loss: ELBO,
        cuda_graph: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, guide, optim, loss, **kwargs)
        fast = isinstance(loss, JitMeanFieldELBO) and isinstance(optim, FusedOptim)
        #: The compiled ELBO whose checked graphs the steps call (``None``: every step is
        #: ``SVI.step``).
        self.compiled_elbo = loss if fast else None
        #: The steps' CUDA graphs (``cuda_graph=True``; see :mod:`.cuda_graph`), else ``None``.
        self.step_graphs = StepGraphs() if cuda_graph else None
        if self.step_graphs is not None and not fast:
            self.step_graphs.warn(
                "the loss is not JitMeanFieldELBO with FusedOptim (fit's default with jit), "
                "whose compiled graph a CUDA graph records"
            )

    def step(self, *args: Any, **kwargs: Any) -> float:
        if self.step_graphs is not None:
            with self.step_graphs.stream(args):
                return self._step(args, kwargs)
        return self._step(args, kwargs)

    def _step(self, args: tuple, kwargs: dict[str, Any]) -> float:
        if self.compiled_elbo is None:
            return self._eager_step(args, kwargs)
        # The key of the graph includes the handlers active at the call: those of SVI.step,
        # which enters a trace (keyed by its type) around the loss; not entered here.
        ready = self.compiled_elbo.checked_graph(
            self.model, self.guide, args, kwargs, inner=(TraceMessenger,)
        )
        if ready is None:
            return self._eager_step(args, kwargs)
        graph, names = ready
        store = dict(pyro.get_param_store().named_parameters())  # unconstrained tensors
        params = [store[name] for name in names]
        if self.step_graphs is not None:
            blocker = (
                "keyword tensors are not inputs of the loss graph"
                if any(torch.is_tensor(v) for v in kwargs.values())
                else None
            )
            out = self.step_graphs.step(graph, params, args, self.optim.flat_for(params), blocker)
            if out is not None:
                if out != out:
                    warn_if_nan(out, "loss")
                return out
        loss = graph(*params, *args)
        loss.backward()
        self.optim(params)
        self.optim.clear_grads(params)
        loss = loss.item()
        if loss != loss:  # (warn_if_nan's frame lookup only where it warns)
            warn_if_nan(loss, "loss")
        return loss

    def _eager_step(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``SVI.step``, but with :class:`~pyro_dropout.infer.FusedOptim` the gradients are
        cleared by :meth:`~pyro_dropout.infer.FusedOptim.clear_grads`: Pyro's ``zero_grads``
        gives each parameter a new zero tensor, which the flat Adam copies back into its
        buffer at the next step (a copy and an allocation per parameter, every step)."""
        if not isinstance(self.optim, FusedOptim):
            return super().step(*args, **kwargs)
        with poutine.trace(param_only=True) as capture:
            loss = self.loss_and_grads(self.model, self.guide, *args, **kwargs)
        params = list(
            dict.fromkeys(site["value"].unconstrained() for site in capture.trace.nodes.values())
        )
        self.optim(params)
        self.optim.clear_grads(params)
        if isinstance(loss, tuple):  # (as SVI.step: e.g. ReweightedWakeSleep's pair)
            return type(loss)(map(torch_item, loss))
        return torch_item(loss)

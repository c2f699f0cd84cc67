"""A compiled training step recorded once as a CUDA graph and replayed (``cuda_graph=True``).

Why: on a GPU a small network's step is bound by kernel launches, not arithmetic: the W1
workload (8-50-1, batch 32) runs ~100 small kernels per step (the captured loss, its
backward, Adam), each costing the CPU more time to launch than the GPU to run. A CUDA graph
(``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``, public: torch's "CUDA Graphs" notes)
records the kernels of one whole step once, and each later step launches them with one call.
Measured on an H200: see ``docs/benchmarks/speed.md`` (the CUDA rows name the device).

What is recorded: the checked ``torch.fx`` graph of the loss
(:class:`~pyro_dropout.infer.JitMeanFieldELBO`), its backward into the flat Adam's gradient
buffer, the flat Adam update (torch's fused kernel, whose step count lives on the device) and
the gradients' reset: the same step :class:`~pyro_dropout.infer.CompiledSVI` runs without a
graph. Each step copies the minibatch into the graph's fixed input tensors and replays it.
Random draws are the generator's (torch advances its offset at each replay): the same
distribution as without the graph, and in the runs measured (H200, torch 2.11) the same
numbers (equal final losses), which torch does not promise.

When a step is not graphed (each said once, by a :class:`CompilationWarning`, where the user
asked for graphs): tensors not on a CUDA device, an optimiser other than the flat Adam (e.g.
clipping, or after :attr:`~pyro_dropout.infer.FusedOptim.optimizer` was read), or a step
whose kernels cannot be recorded. Such steps run as they would without ``cuda_graph``;
except where the failed recording broke torch's CUDA random generator (a CUDA call such as a
synchronisation inside it, measured on torch 2.11): no later draw can run in that process, so
that is a ``RuntimeError`` saying so. A graph is re-recorded when its parameters move
(another buffer) or the learning rate changes.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..handlers.lrt_messenger import _user_stacklevel
from .compile_warning import CompilationWarning
from .flat_adam import FlatAdam

__all__ = [
    "GraphedStep",
    "RecordingError",
    "StepGraphs",
    "WARMUP_STEPS",
    "generator_usable",
    "graph_blocker",
]

#: Steps run eagerly on a side stream before recording (torch's CUDA-graph notes: "warm up
#: ... a few iterations" so that lazy initialisation, e.g. of cuBLAS workspaces and of
#: autograd's per-device state, happens outside the recording).
WARMUP_STEPS = 3


def graph_blocker(params: Sequence[torch.Tensor], args: Sequence[Any]) -> str | None:
    """Why a step over ``params`` and ``args`` cannot be a CUDA graph (``None``: it can)."""
    if not any(torch.is_tensor(a) for a in args):
        # (the steps' side stream is chosen by the arguments' device, see StepGraphs.stream)
        return "the step's arguments hold no tensor (the data must be passed to the model)"
    tensors = [*params, *(a for a in args if torch.is_tensor(a))]
    devices = {t.device for t in tensors}
    if any(d.type != "cuda" for d in devices):
        return "the parameters and data are not all on a CUDA device"
    if len(devices) > 1:
        return f"the tensors are on several devices ({sorted(map(str, devices))})"
    return None


def generator_usable(device: torch.device) -> bool:
    """Whether a random operation runs on ``device``. Measured on an H200 (torch 2.11,
    ``tools/gpu/failed_capture_probe.py``): a recording that a CUDA call breaks (e.g. a
    synchronisation inside it) leaves the CUDA generator raising "Offset increment outside
    graph capture encountered unexpectedly" at every later draw, also after
    ``torch.cuda.manual_seed``; one that a Python exception stops does not."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):  # (the fit's own draws stay as they were)
            torch.rand((), device=device)
    except RuntimeError:
        return False
    return True


class RecordingError(RuntimeError):
    """The step's kernels could not be recorded as a CUDA graph (the message says why)."""


class GraphedStep:
    """One training step (``loss = graph(*params, *args)``, backward, ``flat.step()``,
    ``flat.zero_grad()``), run eagerly for :data:`WARMUP_STEPS` calls, then
    recorded as a CUDA graph and replayed. Each call is exactly one training step and returns
    its loss as a Python float.

    :param graph: the loss graph (takes the parameters' unconstrained tensors, then ``args``).
    :param params: those tensors (leaves on the flat Adam's buffer).
    :param FlatAdam flat: the optimiser stepping exactly ``params``.
    """

    def __init__(
        self, graph: Callable[..., torch.Tensor], params: Sequence[torch.Tensor], flat: FlatAdam
    ) -> None:
        self.graph = graph
        self.params = list(params)
        self.flat = flat
        self._hyper = dict(flat.hyper)
        self.warm = 0
        #: The recorded graph's replay (``None`` before recording).
        self.cuda_graph: Callable[[], None] | None = None
        self._inputs: list[Any] = []
        self._loss: torch.Tensor | None = None

    def valid_for(self, params: Sequence[torch.Tensor], flat: FlatAdam | None) -> bool:
        """Whether a recorded graph still steps these parameters with this optimiser (the
        same tensors at the same addresses, the same hyperparameters)."""
        return (
            flat is self.flat
            and len(params) == len(self.params)
            and all(a is b for a, b in zip(params, self.params, strict=True))
            and flat.hyper == self._hyper
        )

    def _body(self, args: Sequence[Any]) -> torch.Tensor:
        loss = self.graph(*self.params, *args)
        loss.backward()
        self.flat.step()
        self.flat.zero_grad()
        return loss.detach()

    def __call__(self, args: Sequence[Any]) -> float:
        if self.cuda_graph is not None:
            return self._replay(args)
        if self.warm < WARMUP_STEPS:
            loss = self._warmup(args)
            self.warm += 1
            return loss
        try:
            self._record(args)
        except RuntimeError as err:
            raise RecordingError(f"{type(err).__name__}: {err}") from err
        return self._replay(args)

    def _warmup(self, args):
        return self._body(args).item()

    def _record(self, args):
        """Record the step on fixed input tensors (``RuntimeError`` if it cannot be; the
        optimiser's state is then as before)."""
        inputs = [a.clone() if torch.is_tensor(a) else a for a in args]
        count = self.flat.step_count
        try:
            replay, loss = self._capture(lambda: self._body(inputs))
        finally:
            # recording runs no kernel: the step is taken at each replay (and counted there)
            self.flat.step_count = count
        self.cuda_graph, self._inputs, self._loss = replay, inputs, loss

    @staticmethod
    def _capture(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """``(replay, output)``: ``fn``'s kernels recorded as a CUDA graph (not run), on the
        current stream (the steps' side stream, see :meth:`StepGraphs.stream`)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
            out = fn()
        return graph.replay, out

    def _replay(self, args):
        for fixed, a in zip(self._inputs, args, strict=True):
            if torch.is_tensor(fixed):
                fixed.copy_(a)
        self.cuda_graph()
        self.flat.step_count += 1
        return self._loss.item()


class StepGraphs:
    """The :class:`GraphedStep` of each compiled loss graph of one SVI (recorded lazily),
    and the one warning per reason a step is not graphed."""

    def __init__(self) -> None:
        self._steps: dict[int, tuple[Any, GraphedStep | None]] = {}
        self._warned: set[str] = set()
        self._streams: dict[torch.device, Any] = {}

    @contextlib.contextmanager
    def stream(self, args: Sequence[Any]) -> Iterator[None]:
        """Run a whole step (also the ungraphed ones) on one side stream per CUDA device,
        ordered after the current stream's work and before its later work. Why: a graph is
        recorded on a side stream, and autograd runs each parameter's gradient accumulation on
        the stream it was created on; created by the first steps on the default stream, it
        made the recording fail (measured on an H200, torch 2.11: "operation would make the
        legacy stream depend on a capturing blocking stream"). Also torch's CUDA-graph notes:
        warm up on a side stream."""
        device = next((a.device for a in args if torch.is_tensor(a) and a.is_cuda), None)
        if device is None:
            yield
            return
        side = self._streams.get(device)
        if side is None:
            side = self._streams[device] = torch.cuda.Stream(device=device)
        current = torch.cuda.current_stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            yield
        current.wait_stream(side)

    def step(
        self,
        graph: Callable[..., torch.Tensor],
        params: Sequence[torch.Tensor],
        args: Sequence[Any],
        flat: FlatAdam | None,
        blocker: str | None,
    ) -> float | None:
        """One graphed step, or ``None`` (after one warning per reason) where this step
        cannot be graphed: the caller then runs it without a graph."""
        reason = blocker or graph_blocker(params, args)
        if reason is None and flat is None:
            reason = (
                "the optimiser is not the flat Adam (fit's default Adam without gradient "
                "clipping, before its .optimizer is read)"
            )
        if reason is not None or flat is None:
            self._steps.clear()  # (frees the graphs' memory pools)
            self.warn(reason or "")
            return None
        entry = self._steps.get(id(graph))
        graphed = None if entry is None or entry[0] is not graph else entry[1]
        if entry is not None and entry[0] is graph and graphed is None:
            return None  # its recording failed (said once)
        if graphed is None or not graphed.valid_for(params, flat):
            graphed = GraphedStep(graph, params, flat)
            self._steps[id(graph)] = (graph, graphed)
        try:
            return graphed(args)
        except RecordingError as err:
            self._steps[id(graph)] = (graph, None)
            if not generator_usable(params[0].device):
                raise RuntimeError(
                    f"pyro_dropout: cuda_graph=True: recording the step failed ({err}), and "
                    "the failed recording left torch's CUDA random generator unusable in this "
                    "process (its random operations now raise). Run the fit again in a new "
                    "process with cuda_graph=False."
                ) from err
            self.warn(f"recording the step failed with {err}")
            return None

    def warn(self, reason: str) -> None:
        """One :class:`CompilationWarning` per ``reason``: this step is not graphed."""
        if reason in self._warned:
            return
        self._warned.add(reason)
        warnings.warn(
            f"pyro_dropout: cuda_graph=True but this step is not a CUDA graph ({reason}); it "
            "runs as without cuda_graph: the same step, one kernel launch per operation.",
            CompilationWarning,
            stacklevel=_user_stacklevel(sys._getframe()),  # the user's fit or SVI.step line
        )

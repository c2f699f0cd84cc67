"""One torch optimiser over all of SVI's parameters.

Why our own: :class:`pyro.optim.PyroOptim` creates one torch optimiser *per parameter tensor*
and steps them one by one. A Bayesian network's guide has several tensors per layer (means,
scales, α's, biases), so on a small network the optimiser loop costs more than the
arithmetic (measured at the 8-50-1 speed workload: ~0.5 ms of a 1.2 ms step). :class:`FusedOptim`
keeps a single optimiser whose parameter list grows as SVI meets new parameters, and uses
torch's fused kernel (or else its multi-tensor ``foreach`` update) where the optimiser has
one. Element-wise optimisers (Adam, SGD, …) compute exactly the same update as Pyro's
per-parameter ones. Only public API: plain Adam (fit's default) is stepped by
:class:`~pyro_dropout.infer.flat_adam.FlatAdam` on one flat buffer (torch's fused Adam kernel
through the functional ``torch.optim.adam.adam``, or its single-tensor update where
the caller turned the kernel off; a step 0.3-0.75 ms faster at the speed page's W1 than
``Adam(fused=True).step()`` over the parameter tensors, whose ``Optimizer.step`` wrapper costs
more than the arithmetic there); anything else, and Adam from the first step the flat one
cannot follow exactly, is ``optimizer.step()`` of a ``torch.optim`` optimiser. (A steady
state calling ``torch._fused_adam_`` on cached lists, the route before issue 38, is gone: a
private internal whose change would break ``fit``.)
"""

import inspect
from collections.abc import Iterable
from typing import Any

import pyro
import torch
from pyro.optim import PyroOptim
from torch.nn.utils import clip_grad_norm_, clip_grad_value_

from .flat_adam import FlatAdam, flat_adam_args, flat_eligible

__all__ = ["FusedOptim", "fused_adam"]


class FusedOptim(PyroOptim):
    """Drop-in for a :class:`pyro.optim.PyroOptim` (pass it to ``SVI``): one
    ``optim_constructor`` instance over every parameter, created at the first step and
    extended (``add_param_group``) when new parameters appear.

    As in Pyro, a step updates only the parameters SVI hands it (those the traced model and
    guide touched); the others keep their values and optimiser state. Gradient clipping
    (``clip_args`` with ``clip_norm``/``clip_value``) is per parameter tensor, as in Pyro.

    For plain ``torch.optim.Adam`` (``fused_adam``, fit's default) the steps are
    :class:`~pyro_dropout.infer.flat_adam.FlatAdam`'s: the parameters and their gradients are
    moved onto one flat buffer and Adam is one call of torch's fused kernel on it (the same
    update to rounding; measured 0.3-0.75 ms faster per step at the speed page's W1 than
    ``Adam(fused=True).step()``, and 0.13-0.27 of a plain step faster at W2 than the same
    update done by hand, see that module).
    That holds while every parameter steps every step; the first step where one does not
    (a subset, a missing gradient, new parameters, a parameter replaced), and any read of
    :attr:`optimizer`, hand the state to a ``torch.optim.Adam`` that takes the later steps.
    The parameters stay on the buffer after training (same tensor objects, same values): saving
    the param store or a module is unchanged, but ``torch.save`` of one parameter writes the
    storage it shares with the others (``.clone()`` it first to save it alone).

    :param optim_constructor: a ``torch.optim.Optimizer`` class, e.g. ``torch.optim.Adam``.
    :param dict optim_args: its keyword arguments (one dict for all parameters; per-parameter
        callables need Pyro's per-parameter optimisers). Unless the dict sets ``fused`` or
        ``foreach``, ``fused=True`` is added when the constructor accepts it (falling back to
        ``foreach=True`` where the fused kernel does not support the parameters), else
        ``foreach=True`` when accepted.
    """

    def __init__(
        self,
        optim_constructor: type[torch.optim.Optimizer],
        optim_args: dict[str, Any],
        clip_args: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(optim_args, dict):
            raise TypeError(
                "FusedOptim takes one dict of optimiser arguments for all parameters; for "
                "per-parameter arguments use pyro.optim (one optimiser per parameter)"
            )
        if clip_args is not None and not isinstance(clip_args, dict):
            raise TypeError("FusedOptim takes clip_args as a dict (clip_norm and/or clip_value)")
        optim_args = dict(optim_args)
        try:
            accepted = set(inspect.signature(optim_constructor).parameters)
        except (TypeError, ValueError):
            accepted = set()
        # Fastest first: a fused kernel (one pass per step; measured 3.5x faster than foreach
        # for Adam on CPU), else the multi-tensor path. A setting given by the caller wins.
        self._fallback = None
        if not {"fused", "foreach"} & set(optim_args):
            if "fused" in accepted:
                optim_args["fused"] = True
                if "foreach" in accepted:
                    self._fallback = {"foreach": True}
            elif "foreach" in accepted:
                optim_args["foreach"] = True
        super().__init__(optim_constructor, optim_args, clip_args)
        self._optimizer: Any = None  # the torch optimiser, made at the first step
        self._flat: FlatAdam | None = None  # or the flat Adam (see the class docs)
        self._flat_hyper = flat_adam_args(optim_constructor, optim_args)
        self._members: set[torch.Tensor] = set()
        self._pending_state: dict[str, Any] | None = None

    @property
    def optimizer(self) -> Any:
        """The ``torch.optim`` optimiser (``None`` before the first step). Where the flat Adam
        steps, reading this hands it its state (per parameter, as torch keeps it), and it
        takes every later step: step hooks, learning-rate schedulers and ``state[p]`` then
        work as on any torch optimiser."""
        if self._flat is not None:
            self._materialize()
        return self._optimizer

    def __call__(self, params: Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        params = list(params)
        flat = self._flat
        if flat is not None:
            same = len(params) == len(flat.params) and self._members.issuperset(params)
            if same and not args and not kwargs and flat.ready():
                self._clip_all(params)
                flat.step()
                return
            self._materialize()
        new = [p for p in params if p not in self._members]
        if new:
            store = pyro.get_param_store()
            new.sort(key=lambda p: _name(store, p))  # SVI passes a set: fix the order
            if self._optimizer is not None:
                self._optimizer.add_param_group({"params": new})
            elif args or kwargs or not self._start_flat(new):
                self._optimizer = self._construct(new)
            elif self._flat is not None:
                self._clip_all(params)
                self._flat.step()
                return
            # (else the flat Adam handed its state to a torch optimiser on loading a state)
            self._members.update(new)
            self._load_pending()
        self._clip_all(params)
        # Only this step's parameters move (Pyro's semantics): hide the others' gradients.
        current = set(params)
        hidden = [(p, p.grad) for p in self._members if p not in current and p.grad is not None]
        for p, _ in hidden:
            p.grad = None
        try:
            self._optimizer.step(*args, **kwargs)
        finally:
            for p, grad in hidden:
                p.grad = grad

    def flat_for(self, params: list[torch.Tensor]) -> FlatAdam | None:
        """The flat Adam where its next step is exactly a step of ``params`` (every one of its
        parameters, each with its gradient, no clipping), else ``None``: what a CUDA graph of
        the whole step may record (:mod:`~pyro_dropout.infer.cuda_graph`)."""
        flat = self._flat
        if flat is None or self.pt_clip_args or len(params) != len(flat.params):
            return None
        if not self._members.issuperset(params) or not flat.ready():
            return None
        return flat

    def clear_grads(self, params: list[torch.Tensor]) -> None:
        """After a step of ``params``: their gradients cleared, to ``None`` as
        ``torch.optim.Optimizer.zero_grad`` does, or zeroed in place where the flat Adam
        steps (they are views of its buffer, which backward then accumulates into)."""
        flat = self._flat
        if flat is not None and len(params) == len(flat.params):
            flat.zero_grad()
            return
        for p in params:
            p.grad = None

    def _clip_all(self, params):
        if self.pt_clip_args:
            for p in params:
                if p.grad is not None:
                    _clip(p, **self.pt_clip_args)

    def _start_flat(self, params):
        """Step with :class:`FlatAdam` from the first step where it is exact for these;
        ``True`` where it started (it may have handed over to torch's Adam already)."""
        if self._flat_hyper is None or not flat_eligible(params):
            return False
        try:
            fused = self.pt_optim_args.get("fused") is True  # the kernel torch's Adam would run
            self._flat = FlatAdam(params, self._flat_hyper, fused=fused)
        except RuntimeError:  # a tensor that cannot be re-homed (made by .detach()): torch's
            return False
        self._members.update(params)
        self._load_pending()  # a saved state that is not one flat Adam's: handed over
        return True

    def _materialize(self):
        """Hand the flat Adam's state to a ``torch.optim.Adam`` over the same parameters."""
        flat, self._flat = self._flat, None
        optimizer = self._construct(flat.params)
        optimizer.param_groups[0].update(flat.hyper)
        group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        optimizer.load_state_dict(flat.state_dict(group))
        self._optimizer = optimizer

    def _group(self):
        """``torch.optim.Adam``'s parameter group for these arguments, without building one
        (the first optimiser a process builds imports ``torch._dynamo``: seconds)."""
        signature = inspect.signature(self.pt_optim_constructor).parameters
        group = {k: v.default for k, v in signature.items() if k != "params"}
        return {**group, **self.pt_optim_args, **self._flat.hyper}

    def _construct(self, params):
        try:
            return self.pt_optim_constructor(params, **self.pt_optim_args)
        except (RuntimeError, ValueError):
            if self._fallback is None:
                raise
            # the fused kernel does not support these parameters (device or dtype)
            args = {k: v for k, v in self.pt_optim_args.items() if k != "fused"}
            self.pt_optim_args = {**args, **self._fallback}
            self._fallback = None
            return self.pt_optim_constructor(params, **self.pt_optim_args)

    def _names(self):
        store = pyro.get_param_store()
        if self._flat is not None:
            return [_name(store, p) for p in self._flat.params]
        return [_name(store, p) for group in self._optimizer.param_groups for p in group["params"]]

    def get_state(self) -> dict[str, Any]:
        """``{"param_names": [...], "state_dict": optimizer.state_dict()}`` (names in the
        optimiser's parameter order; from the flat Adam, the state dict torch's Adam would
        have); empty before the first step."""
        if self._flat is not None:
            return {
                "param_names": self._names(),
                "state_dict": self._flat.state_dict(self._group()),
            }
        if self._optimizer is None:
            return {}
        return {"param_names": self._names(), "state_dict": self._optimizer.state_dict()}

    def set_state(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`get_state` result; applied once the optimiser holds exactly those
        parameters (immediately if it already does)."""
        if state_dict:
            self._pending_state = state_dict
            if self._optimizer is not None or self._flat is not None:
                self._load_pending()

    def _load_pending(self):
        state = self._pending_state
        if state is None:
            return
        names = self._names()
        if sorted(names) != sorted(state["param_names"]):
            return  # not all parameters met yet
        if self._flat is not None:
            if self._load_flat(names, state):
                self._pending_state = None
                return
            self._materialize()
            names = self._names()
        sizes = [len(g["params"]) for g in state["state_dict"]["param_groups"]]
        if names != state["param_names"] or sizes != self._group_sizes():
            # Same parameters, another order or grouping (parameters met at different steps):
            # rebuild the optimiser as it was saved.
            store = pyro.get_param_store()
            by_name = {_name(store, p): p for p in self._members}
            params = [by_name[n] for n in state["param_names"]]
            self._optimizer = self._construct(params[: sizes[0]])
            start = sizes[0]
            for size in sizes[1:]:
                self._optimizer.add_param_group({"params": params[start : start + size]})
                start += size
        self._optimizer.load_state_dict(state["state_dict"])
        self._pending_state = None

    def _group_sizes(self):
        return [len(g["params"]) for g in self._optimizer.param_groups]

    def _load_flat(self, names, state):
        """Load a saved state into the flat Adam where it is one (hyperparameters of plain
        Adam shared by every group, one step count); ``False`` otherwise."""
        groups = state["state_dict"]["param_groups"]
        hypers = [
            flat_adam_args(torch.optim.Adam, {k: v for k, v in g.items() if k != "params"})
            for g in groups
        ]
        if not hypers or None in hypers or any(h != hypers[0] for h in hypers):
            return False
        index = {name: i for i, name in enumerate(state["param_names"])}
        saved = state["state_dict"]["state"]
        by_flat = {i: saved[index[n]] for i, n in enumerate(names) if index[n] in saved}
        if not self._flat.load(by_flat):
            return False
        self._flat.hyper = hypers[0]
        return True


def _name(store, p):
    name = store.param_name(p)
    return str(id(p)) if name is None else name  # not in the param store: order by identity


def _clip(p, clip_norm=None, clip_value=None):
    if clip_norm is not None:
        clip_grad_norm_(p, clip_norm)
    if clip_value is not None:
        clip_grad_value_(p, clip_value)


def fused_adam(optim_args: dict[str, Any]) -> FusedOptim:
    """``FusedOptim(torch.optim.Adam, optim_args)``: the counterpart of
    ``pyro.optim.Adam(optim_args)`` with one multi-tensor Adam over all parameters."""
    return FusedOptim(torch.optim.Adam, optim_args)

"""Checkpoints of a batched training, so that one phase can span several sittings.

Why: the validation phase of a large dataset at two hidden layers (240 members, 4,000 epochs)
is hours of one CPU thread (``--estimate``: kin8nm ~6.7 h, naval ~11 h), longer than a sitting,
and a unit is only written when its phase ends. Smaller ``--split-batch`` values finish sooner
but train fewer members per step (measured: batches of 4-7 members give ~2x the member-steps
per second of batches of 2). So :func:`~benchmarks.uci_model.train` saves its state here
every ``every_s`` seconds and when the process gets ``SIGTERM`` (at the next step boundary),
and a run with ``--resume`` continues from it.

What is saved: the step, the epoch's row permutation, Pyro's param store, the optimiser's
state (:meth:`~pyro_dropout.infer.FusedOptim.get_state`), the random states of torch, NumPy
and Python (:func:`pyro.util.get_rng_state`), the wall time, compile time and loss so far.
A resumed training starts from exactly that state, but its later steps do not draw the very
numbers an uninterrupted one would: the new process sets its guide up (Pyro's autoguides
trace the model once, drawing from the same generator) and the traced loss re-traces its graph
at the resumed step, not at step 0. So it continues the same optimisation with another stream
of the same distribution, like a run with another seed; each unit records the steps at which
its phase resumed (``resumed_at_steps``).

A checkpoint names what it continues (``key``: dataset, guide, phase, splits, seed, the
protocol's settings, the members' configurations and the code's commit); one of another key
is refused with an error rather than resumed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyro
import pyro.util
import torch

__all__ = ["Checkpoint", "Interrupted"]

#: Default seconds between checkpoints (a sitting killed without ``SIGTERM`` loses at most this).
EVERY_S = 600.0


class Interrupted(SystemExit):
    """Raised by the training loop after it saved a checkpoint on ``SIGTERM``."""


class Checkpoint:
    """A training's checkpoint file ``path`` for the run described by ``key``.

    :param path: where the checkpoint lives (written atomically: a file beside it, then
        renamed; never half-written).
    :param key: JSON-serialisable description of the run it belongs to; :meth:`load` refuses
        a file whose key differs.
    :param every_s: seconds between periodic saves (``0``: only on ``SIGTERM`` and at the end
        of training).
    """

    def __init__(self, path: str | os.PathLike, key: dict[str, Any], every_s: float = EVERY_S):
        self.path = Path(path)
        self.key = json.loads(json.dumps(key, sort_keys=True, default=str))
        self.every_s = float(every_s)
        self._last = time.monotonic()
        self._stop = False
        self._previous: Any = None

    def load(self) -> dict[str, Any] | None:
        """The saved state, or ``None`` where there is no file; ``RuntimeError`` where the
        file belongs to another run (its key differs)."""
        if not self.path.is_file():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if state.get("key") != self.key:
            diff = sorted(
                k
                for k in set(self.key) | set(state.get("key", {}))
                if self.key.get(k) != state.get("key", {}).get(k)
            )
            raise RuntimeError(
                f"checkpoint {self.path} belongs to another run (differs in {', '.join(diff)}); "
                "delete it to start this phase afresh"
            )
        return state

    def restore(self, state: dict[str, Any], optim: Any, guide_name: str | None = None) -> None:
        """Load ``state`` (from :meth:`load`) into Pyro's param store, ``optim`` and the
        random generators: call after the store is cleared and seeded, before the first step.

        ``guide_name``: the guide's name in the param store (its parameters are named
        ``<guide_name>.<attribute>``); the saved guide's parameters and their optimiser state
        are renamed to it (each batched guide of a process is numbered, and a resumed process
        may number it otherwise)."""
        device = torch.get_default_device()
        rename = _renamer(state.get("guide_name"), guide_name)
        params = state["params"]
        params["params"] = {rename(k): _leaf(v, device) for k, v in params["params"].items()}
        params["constraints"] = {rename(k): c for k, c in params["constraints"].items()}
        pyro.get_param_store().set_state(params)
        optim_state = dict(state["optim"])
        if optim_state:
            optim_state["param_names"] = [rename(k) for k in optim_state["param_names"]]
        optim.set_state(optim_state)
        pyro.util.set_rng_state(state["rng"])

    def due(self) -> bool:
        """Whether to save now: ``SIGTERM`` received, or ``every_s`` elapsed."""
        if self._stop:
            return True
        return self.every_s > 0 and time.monotonic() - self._last >= self.every_s

    @property
    def stopping(self) -> bool:
        """Whether ``SIGTERM`` asked the training to stop (after saving)."""
        return self._stop

    def save(self, optim: Any, **fields: Any) -> None:
        """Write the param store, ``optim``'s state, the random states and ``fields``."""
        state = {
            "key": self.key,
            "params": pyro.get_param_store().get_state(),
            "optim": optim.get_state(),
            "rng": pyro.util.get_rng_state(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **fields,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.path)
        self._last = time.monotonic()

    def remove(self) -> None:
        """Delete the file (its phase's units are written)."""
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Checkpoint:
        # SIGTERM (e.g. ``pkill``) only sets a flag: the loop saves at the next step boundary,
        # never inside an optimiser step. Handlers can only be set from the main thread.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_term(self, signum: int, frame: Any) -> None:
        self._stop = True


def _leaf(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``value`` on ``device`` as a leaf of its kind (a ``Parameter`` stays one, and keeps
    ``requires_grad``); ``.to`` alone would give a non-leaf where the device changes."""
    out = value.detach().to(device)
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=value.requires_grad)
    return out.requires_grad_(value.requires_grad)


def _renamer(saved: str | None, current: str | None) -> Any:
    """Rename ``<saved>.<attribute>`` to ``<current>.<attribute>`` (others unchanged)."""
    if saved is None or current is None or saved == current:
        return lambda name: name
    old, new = saved + ".", current + "."
    return lambda name: new + name[len(old) :] if name.startswith(old) else name

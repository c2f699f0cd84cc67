"""Training the members: the minibatch loop of the ELBO (fused kernels, traced or eager)."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import pyro
import torch

from pyro_dropout import local_reparameterization
from pyro_dropout.infer import CompiledSVI, JitMeanFieldELBO, MeanFieldELBO, fused_adam

from .. import uci_fused
from .checkpoint import Checkpoint, Interrupted
from .members import _expand_members

#: Steps per minibatch shape that ``JitMeanFieldELBO`` spends tracing (it traces the first two
#: calls and checks that the graphs agree) plus the first run of the traced graph.
_WARM_STEPS = 3


@dataclass
class FitStats:
    steps: int
    wall_s: float
    final_loss: float
    #: Of ``wall_s``, the seconds of the first :data:`_WARM_STEPS` steps of each minibatch
    #: shape (tracing the compiled loss; the rate of later steps excludes them).
    compile_s: float = 0.0
    warm_steps: int = 0
    jit: bool = False
    #: What computed the loss: ``"fused"`` (:mod:`~benchmarks.uci_fused`'s
    #: kernels), ``"traced"`` (``JitMeanFieldELBO``; ``"traced+cuda_graph"`` with its steps
    #: recorded as CUDA graphs) or ``"eager"`` (``MeanFieldELBO``).
    engine: str = "traced"
    #: Steps at which this training resumed from a checkpoint (empty: one uninterrupted run).
    resumed_at: tuple[int, ...] = ()

    @property
    def steps_per_s(self):
        return self.steps / self.wall_s if self.wall_s > 0 else math.inf


def train(
    model,
    guide,
    x,
    y,
    per_split,
    num_epochs,
    batch_size=128,
    lr=1e-3,
    seed=0,
    max_steps=None,
    jit=True,
    fused=True,
    kernels=None,
    cuda_graph=False,
    checkpoint: Checkpoint | None = None,
):
    """Fit ``guide`` with ``MeanFieldELBO`` + local reparameterisation + Adam.

    :param x: ``(S, N, D)`` standardised inputs of S splits (equal N), :param y: ``(S, N)``.
    :param per_split: members per split (members are ordered split-major).
    Minibatches: one random permutation of the N row positions per epoch, shared by all
    members (each split permutes its own rows); the last batch of an epoch is smaller, as in
    Keras. The likelihood is scaled by ``N / B``, the KL counted once per step.
    :param max_steps: stop early (timing runs).
    :param jit: use :class:`~pyro_dropout.infer.JitMeanFieldELBO` (one trace per minibatch
        shape, replayed as an FX graph of the captured loss). The same estimator as the eager
        ``MeanFieldELBO``, but not the same random stream: the traced graph drops the guide's
        weight draws that local reparameterisation leaves unused.
    :param fused: one fused Adam over all parameters (:func:`~pyro_dropout.infer.fused_adam`,
        the same update as ``pyro.optim.Adam``).
    :param kernels: train with :func:`~benchmarks.uci_fused.fused_loss`
        (mean-field, variational dropout, MC dropout and Concrete dropout)
        (the same loss as the traced one given the same noise, from numba kernels): ``None``
        (the default) when ``jit`` and it supports the pair on CPU tensors, ``True`` always
        (``ValueError`` naming why not), ``False`` never.
    :param cuda_graph: on a GPU, record the compiled step as a CUDA graph (``fit``'s
        ``cuda_graph``; :mod:`pyro_dropout.infer.cuda_graph`).
    :param checkpoint: continue from this :class:`~.checkpoint.Checkpoint` where its file
        exists, save to it every ``checkpoint.every_s`` seconds, at the end of training and on
        ``SIGTERM`` (then raise :class:`~.checkpoint.Interrupted`, a ``SystemExit``). The
        file stays until the caller removes it (its units are written).
    """
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    n = x.shape[1]
    steps_per_epoch = math.ceil(n / batch_size)
    total = num_epochs * steps_per_epoch if max_steps is None else max_steps
    optim = fused_adam({"lr": lr}) if fused else pyro.optim.Adam({"lr": lr})
    if cuda_graph and (not jit or x.device.type != "cuda"):
        raise ValueError("train(cuda_graph=True) records the compiled step: jit on CUDA tensors")
    if kernels is None:  # compiled training: the kernels where they apply
        kernels = jit and x.device.type == "cpu" and uci_fused.supports(model, guide)
    elif kernels and not uci_fused.supports(model, guide):
        raise ValueError(f"kernels=True: {uci_fused.unsupported_reason(model, guide)}")
    if kernels:
        engine = "fused"
        svi = uci_fused.FusedSVI(model, guide, optim)
    else:
        engine = ("traced+cuda_graph" if cuda_graph else "traced") if jit else "eager"
        elbo = (JitMeanFieldELBO if jit else MeanFieldELBO)(
            max_plate_nesting=model.max_plate_nesting
        )
        # SVI.step where not compiled and fused
        svi = CompiledSVI(model, guide, optim, elbo, cuda_graph=cuda_graph)
    loss = math.nan
    order = None
    seen, warm_steps, compile_s = {}, 0, 0.0
    first, before_s, resumed_at = 0, 0.0, ()
    # The guide's name in the param store is PyroModule's ``_pyro_name`` (the prefix of its
    # parameters; set from the builders' ``name=``): Pyro has no public accessor for it.
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        checkpoint.restore(saved, optim, getattr(guide, "_pyro_name", None))
        first, order, loss = saved["step"], saved["order"], saved["loss"]
        before_s, compile_s, warm_steps = saved["wall_s"], saved["compile_s"], saved["warm_steps"]
        resumed_at = (*saved["resumed_at"], first)
    start = time.perf_counter()

    def save():  # (the state after `step` steps)
        checkpoint.save(
            optim, step=step, order=order, loss=loss, wall_s=before_s + time.perf_counter() - start,
            compile_s=compile_s, warm_steps=warm_steps, resumed_at=resumed_at,
            guide_name=getattr(guide, "_pyro_name", None),
        )  # fmt: skip

    guard = checkpoint if checkpoint is not None else contextlib.nullcontext()
    with pyro.validation_enabled(False), local_reparameterization(), guard:
        step = first
        while step < total:
            k = step % steps_per_epoch
            if k == 0:
                order = torch.randperm(n)
            idx = order[k * batch_size : (k + 1) * batch_size]
            xb = _expand_members(x[:, idx], per_split)
            yb = _expand_members(y[:, idx], per_split)
            t0 = time.perf_counter()
            loss = svi.step(xb, yb, num_data=n)
            if (jit or kernels) and seen.get(xb.shape, 0) < _WARM_STEPS:
                # the first calls of a minibatch shape trace (and check) the compiled loss
                seen[xb.shape] = seen.get(xb.shape, 0) + 1
                warm_steps += 1
                compile_s += time.perf_counter() - t0
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"UCI benchmark: the loss became {loss} at step {step} of {total}"
                )
            step += 1
            if checkpoint is not None and step < total and checkpoint.due():
                save()
                if checkpoint.stopping:
                    raise Interrupted(
                        f"SIGTERM: training checkpointed at step {step} of {total} in "
                        f"{checkpoint.path}; --resume continues from it"
                    )
        if checkpoint is not None and first < total:
            save()  # trained: a sitting that stops during the evaluation keeps the training
        if checkpoint is not None and checkpoint.stopping:  # SIGTERM during the last step
            raise Interrupted(
                f"SIGTERM: training finished and checkpointed in {checkpoint.path}; --resume "
                "evaluates it"
            )
    return FitStats(
        total,
        before_s + time.perf_counter() - start,
        float(loss),
        compile_s,
        warm_steps,
        jit,
        engine,
        resumed_at,
    )

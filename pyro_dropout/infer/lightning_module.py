"""Training on a PyTorch Lightning ``Trainer``: :class:`BayesianModule` (a
``LightningModule`` whose loss is ``fit``'s ELBO), :func:`fit_on_devices` (``fit(...,
devices=K)``), :func:`make_trainer` and :func:`rank_seed`.

The public module is :mod:`pyro_dropout.lightning`, whose docstring derives the minibatch scale
under DDP and explains the per-rank noise and the checkpoints ("the module docs" below). The code
lives here, in the training layer, so that :func:`~pyro_dropout.infer.fit` reaches it without
importing a module above ``infer`` (``docs/architecture.md``); ``import pyro_dropout.infer``
does not import it (Lightning is an optional dependency).
"""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import pyro
import torch
from pyro.infer.util import is_validation_enabled

from .._checks import positive_int
from ..handlers import local_reparameterization as _lrt
from .conform import check_guide_matches
from .elbo import make_elbo
from .minibatch import (
    StreamCheck,
    accepts_num_data,
    check_num_data_covers,
    dataset_size,
    minibatch_scaling,
)

try:
    import lightning as L
except ImportError as e:  # optional dependency
    raise ImportError(
        'pyro_dropout.lightning needs PyTorch Lightning: pip install "pyro-dropout[lightning]" '
        "(or pip install 'lightning>=2.4')"
    ) from e

__all__ = ["BayesianModule", "fit_on_devices", "make_trainer", "rank_seed"]

_CKPT_KEY = "pyro_dropout"


class BayesianModule(L.LightningModule):
    r"""A ``LightningModule`` that fits ``guide`` to ``model`` by maximising the ELBO (module docs
    for the minibatch scale, per-rank noise and checkpoints).

    :param model: a Pyro model that is a ``torch.nn.Module`` (this library's models, a
        ``PyroModule``), called as ``model(x, y)`` (plus ``num_data=N`` if it takes it).
    :param guide: a guide of this library (``AutoDropout``, ``AutoMeanField``,
        ``AutoVariationalDropout``) or any ``AutoGuide`` whose parameters are module
        parameters (``PyroParam``). Works with Pyro's default global parameter store (the
        store and the module hold the same tensors) and with
        ``pyro.settings.set(module_local_params=True)`` set before building the model and
        guide, as in Pyro's ``examples/svi_lightning.py``. Pyro's ``AutoMessenger`` guides are
        not supported (Pyro reports they break with module-local parameters; untested here).
    :param example: a minibatch ``(x, y)`` (e.g. ``next(iter(loader))``) used once to create
        the guide's parameters, which Pyro creates lazily on the first call; not needed if the
        guide has been called (or fitted) before. Needed before ``configure_optimizers``, and
        to restore a checkpoint into a new module.
    :param int num_data: the full data size ``N``; default the length of the training
        loader's dataset (needed for an ``IterableDataset``).
    :param float lr: Adam's learning rate (``torch.optim.Adam``, the update of ``fit``'s
        default optimiser).
    :param optimizer: instead of Adam, a callable ``params -> torch.optim.Optimizer``.
    :param bool local_reparameterization: as in :func:`~pyro_dropout.fit`.
    :param estimator: as in :func:`~pyro_dropout.fit`.
    :param jit: as in :func:`~pyro_dropout.fit`: ``"auto"`` (default) compiles the loss
        (:class:`~pyro_dropout.infer.JitMeanFieldELBO`) and trains eagerly, with one
        :class:`~pyro_dropout.infer.CompilationWarning`, where it cannot; ``True`` compiles or
        raises; ``False`` is eager.
    :param int num_particles: ELBO particles per step.
    :param bool vectorize_particles: as in Pyro's ELBOs.
    :param int seed: base seed; rank ``r`` uses ``rank_seed(seed, r)`` (module docs).
    :param validate: ``"first"`` (Pyro's argument checks on the first training step only),
        ``"always"`` or ``"never"``; as in :func:`~pyro_dropout.fit`.

    Logged: ``loss`` (each step, this rank's minibatch estimate of the negative ELBO, on the
    progress bar) and, per epoch averaged over steps and ranks, ``elbo``, ``data_term``
    (the expected log-likelihood on the full-data scale) and ``kl`` (``elbo = data_term - kl``).

    Example::

        loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True, drop_last=True)
        model = BayesianMLP(x.shape[1], 1, hidden=(50,), tau=10.0)
        guide = AutoDropout(model, dropout_rate=0.05)
        module = BayesianModule(model, guide, example=next(iter(loader)), lr=1e-3, seed=0)
        lightning.Trainer(max_epochs=50, accelerator="cpu", devices=2, strategy="ddp").fit(
            module, loader)
    """

    def __init__(
        self,
        model,
        guide,
        *,
        example=None,
        num_data=None,
        lr=1e-3,
        optimizer=None,
        local_reparameterization=True,
        estimator="auto",
        jit="auto",
        num_particles=1,
        vectorize_particles=False,
        seed=None,
        validate="first",
    ):
        super().__init__()
        for obj, name in ((model, "model"), (guide, "guide")):
            if not isinstance(obj, torch.nn.Module):
                raise TypeError(
                    f"BayesianModule: the {name} must be a torch.nn.Module (e.g. a PyroModule) "
                    f"so that Lightning can optimise and checkpoint its parameters; got "
                    f"{type(obj).__name__}. Wrap a functional model in a PyroModule whose "
                    "parameters are PyroParam attributes, or use fit()."
                )
        if validate not in ("first", "always", "never"):
            raise ValueError(f"validate must be 'first', 'always' or 'never', got {validate!r}")
        if jit not in (True, False, "auto"):
            raise ValueError(f"jit must be True, False or 'auto', got {jit!r}")
        if num_data is not None:
            num_data = positive_int(num_data, "num_data")
        self.model = model
        self.guide = guide
        self.num_data = num_data
        self.lr = lr
        self.optimizer_factory = optimizer
        self.local_reparameterization = local_reparameterization
        self.estimator = estimator
        self.seed = seed
        self.validate = validate
        self.elbo = make_elbo(model, jit, num_particles, vectorize_particles)
        self._takes_num_data = accepts_num_data(model)
        #: fit's data checks: the rule of the first batch, the rows of the first epoch
        self._check = StreamCheck(model, guide, "BayesianModule")
        self._n = None
        if example is not None:
            self._initialize(example)

    # -- set-up -------------------------------------------------------------------------------
    def _initialize(self, batch):
        """Create the guide's parameters (Pyro creates them on the first call) and check the
        model once on ``batch``."""
        x, y = self._check(batch, check_rows_now=False)
        args = (x,) if y is None else (x, y)
        check_guide_matches(self._check.probe.trace, self.guide, "BayesianModule")
        with torch.no_grad(), self._lrt():
            self.guide(*args)

    def _lrt(self):
        if self.local_reparameterization:
            return _lrt(estimator=self.estimator)
        return contextlib.nullcontext()

    def setup(self, stage):
        # Distinct noise per rank (module docs); a fixed seed in one process.
        world = self.trainer.world_size if self._trainer is not None else 1
        if self.seed is None and world == 1:
            return
        base = self.seed
        if base is None:
            base = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))
        pyro.set_rng_seed(rank_seed(base, self.global_rank))

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        if getattr(self.guide, "prototype_trace", True) is None or not params:
            raise RuntimeError(
                "BayesianModule: the guide has no parameters yet (Pyro creates them on its "
                "first call): pass example=(x, y), a minibatch such as next(iter(loader)), or "
                "call guide(x, y) once before training"
            )
        if self.optimizer_factory is not None:
            return self.optimizer_factory(params)
        return torch.optim.Adam(params, lr=self.lr)

    def on_train_start(self):
        self._n = dataset_size(self.trainer.train_dataloader, self.num_data, "BayesianModule")

    def on_train_epoch_start(self):
        self._check.seen = 0  # rows are numbered from the start of the epoch's stream

    # -- the loss -----------------------------------------------------------------------------
    def elbo_terms(self, batch, num_data=None):
        r"""``(loss, data, kl)`` on one minibatch ``(x, y)`` scaled to ``num_data`` rows
        (default: the training data size): ``loss = kl - data`` is this rank's unbiased
        estimate of the full-data negative ELBO (module docs)."""
        training = self._trainer is not None and self.trainer.training
        first_epoch = training and self.current_epoch == 0
        x, y = self._check(batch, check_rows_now=first_epoch)
        args = (x,) if y is None else (x, y)
        if num_data is not None:
            num_data = positive_int(num_data, "num_data")
        n = num_data if num_data is not None else (self._n or self.num_data)
        if n is None:
            raise RuntimeError(
                "BayesianModule: the full data size is unknown outside Trainer.fit: pass "
                "num_data to elbo_terms or to BayesianModule"
            )
        check_num_data_covers(n, x.shape[0], "BayesianModule")
        kwargs, scaling = minibatch_scaling(self._takes_num_data, n, x.shape[0])
        validating = self.validate == "always" or (
            self.validate == "first" and self.global_step == 0
        )
        with (
            pyro.validation_enabled(validating and is_validation_enabled()),
            self._lrt(),
            scaling if scaling is not None else contextlib.nullcontext(),
        ):
            return self.elbo.loss_terms(self.model, self.guide, *args, **kwargs)

    def training_step(self, batch, batch_idx):
        loss, data, kl = self.elbo_terms(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"BayesianModule: the loss became {loss.item()} at step {self.global_step}; "
                "lower the learning rate, or check the data scale and the prior/noise settings"
            )
        rows = len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
        self.log("loss", loss.detach(), prog_bar=True, batch_size=rows)
        # Epoch means, averaged over ranks once per epoch (not an all-reduce per step).
        self.log_dict(
            {"elbo": -loss.detach(), "data_term": data.detach(), "kl": kl.detach()},
            on_step=False,
            on_epoch=True,
            sync_dist=True,
            batch_size=rows,
        )
        return loss

    # -- checkpoints --------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        # Every rank's generators (called on all ranks, see Trainer.save_checkpoint), so that a
        # resumed run draws what the uninterrupted run would have drawn.
        state = _rng_state()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, state)
        else:
            states = [state]
        checkpoint[_CKPT_KEY] = {"rng_states": states}

    def on_load_checkpoint(self, checkpoint):
        states = checkpoint.get(_CKPT_KEY, {}).get("rng_states")
        world = self.trainer.world_size if self._trainer is not None else 1
        if states and len(states) == world:
            _set_rng_state(states[self.global_rank])
        # else (another number of processes): the seeds of setup() apply.


class _LossHistory(L.Callback):
    """Each step's loss, and ``fit``'s ``callback(step, loss)`` (``True`` stops)."""

    def __init__(self, callback=None):
        self.losses, self.callback = [], callback

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"].item()
        self.losses.append(loss)
        if self.callback is not None and self.callback(len(self.losses) - 1, loss):
            trainer.should_stop = True


def fit_on_devices(
    model,
    guide,
    loader,
    *,
    devices=1,
    num_steps=None,
    num_epochs=None,
    accelerator="auto",
    progress=True,
    callback=None,
    **module_kwargs,
):
    """``fit(..., devices=K)`` (see :func:`~pyro_dropout.fit`): a :class:`BayesianModule` on a
    ``lightning.Trainer`` with ``devices`` devices (``strategy="ddp"`` when more than one),
    for ``num_steps`` steps or ``num_epochs`` epochs; returns this process's per-step losses.
    ``module_kwargs`` go to :class:`BayesianModule` (``lr``, ``seed``, ``jit``, ...)."""
    if (num_steps is None) == (num_epochs is None):
        raise ValueError("pass exactly one of num_steps and num_epochs")
    module = BayesianModule(model, guide, example=next(iter(loader)), **module_kwargs)
    history = _LossHistory(callback)
    trainer = make_trainer(
        devices,
        max_epochs=num_epochs if num_epochs is not None else -1,
        max_steps=num_steps if num_steps is not None else -1,
        accelerator=accelerator,
        progress=progress,
        callbacks=[history],
    )
    trainer.fit(module, loader)
    return history.losses


def make_trainer(devices=1, *, accelerator="auto", progress=True, callbacks=(), **limits):
    """The ``lightning.Trainer`` that :func:`fit_on_devices` uses: ``devices`` devices with
    ``strategy="ddp"`` when more than one, no logger, checkpoints or model summary (the fit
    returns its losses instead), a progress bar if ``progress``; ``limits`` are the Trainer's
    ``max_epochs`` / ``max_steps``."""
    return L.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **limits,
    )


def rank_seed(seed, rank):
    """The seed of rank ``rank``: a hash of ``(seed, rank)`` (numpy's ``SeedSequence``), not
    ``seed + rank``: the user has usually seeded construction with ``seed`` itself, and rank 0
    would then draw its first training noise from the very stream that drew the random
    initial weights (the same numbers). Whether that matters was not established (a 3-seed
    comparison was inconclusive); the hash avoids the question."""
    return int(np.random.SeedSequence([int(seed) % 2**63, int(rank)]).generate_state(1)[0])


def _rng_state():
    # Plain tensors, ints and lists only: Lightning loads checkpoints with torch.load's
    # weights_only=True, which refuses numpy arrays.
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 - pyro seeds it
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (str(kind), keys.tolist(), int(pos), int(has_gauss), float(gauss)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    keys = np.asarray(keys, dtype=np.uint32)
    np.random.set_state((kind, keys, pos, has_gauss, gauss))  # noqa: NPY002
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

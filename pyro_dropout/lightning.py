r"""Training a (model, guide) pair with PyTorch Lightning: one process, several CPU processes
or GPUs (``strategy="ddp"``), checkpoints.

:class:`BayesianModule` is a ``lightning.LightningModule`` whose loss is the ELBO of
:func:`~pyro_dropout.fit` (:class:`~pyro_dropout.infer.MeanFieldELBO`, local
reparameterisation on) computed on the minibatches of an ordinary ``DataLoader``; an ordinary
``lightning.Trainer`` does the rest (devices, gradient averaging, checkpoints, loggers).

**The minibatch scale under DDP.** With ``R`` processes, rank ``r`` gets a minibatch
``B_r`` of ``b_r`` rows from a ``DistributedSampler`` (Lightning inserts it; the ranks' rows are
disjoint) and computes the loss

.. math::

    L_r = \mathrm{KL}(q \,\|\, p) - \frac{N}{b_r} \sum_{i \in B_r} \log p(y_i \mid x_i, w),

an unbiased estimate of the full-data negative ELBO (``N`` rows, one KL). DDP *averages* the
ranks' gradients, so the step uses

.. math::

    \frac1R \sum_r \nabla L_r = \nabla \mathrm{KL} - \frac{N}{R b}
        \sum_{i \in B_1 \cup \dots \cup B_R} \nabla \log p(y_i \mid x_i, w)
    \qquad (b_r = b),

exactly the gradient of one process on the union of the ranks' minibatches (``R b`` rows
scaled by ``N / (R b)``): each rank scales by ``N / b_r`` with its *own* minibatch size, and
``N`` is the size of the whole data set, not of a rank's shard. (A last, smaller minibatch
keeps each rank's estimate unbiased; ``drop_last=True`` makes every step the union gradient.)
The scale is applied as in ``fit``: ``num_data=N`` for a model that takes it (this library's),
:class:`~pyro_dropout.infer.minibatch.ScaleObserved` ``(N / b_r)`` on the observed sites
otherwise.

**Noise per rank.** Dropout masks and the local-reparameterisation noise come from torch's
global generator, whose default seed is the same in every fresh process (and
``seed_everything`` sets one seed everywhere). :meth:`BayesianModule.setup` reseeds each rank
with a hash of ``(seed, rank)`` (:func:`rank_seed`; ``seed``: the ``seed`` argument, else Lightning's ``PL_GLOBAL_SEED``,
else torch's initial seed), so the ranks draw different noise and the averaged gradient has
``R`` times fewer noise draws' variance, while the run stays reproducible.

**Checkpoints.** The model's and guide's parameters are ``nn.Parameter``\ s of the module (the
guide's are created by one call on an example minibatch, ``example=``), so Lightning's
checkpoint holds them with the optimiser state; :meth:`BayesianModule.on_save_checkpoint` adds
every rank's random-number state, restored on resume, so that a resumed run draws the same
noise (and, in one process, the same shuffling) as an uninterrupted one.
"""

from __future__ import annotations

# The implementation is in the training layer (fit(devices=K) calls it); this module is its
# public name. Importing it without Lightning raises the ImportError that says what to install.
from .infer.lightning_module import BayesianModule, fit_on_devices, make_trainer, rank_seed

__all__ = ["BayesianModule", "fit_on_devices", "make_trainer", "rank_seed"]

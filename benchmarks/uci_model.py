r"""Batched Bayesian MLPs for the UCI benchmark: many hyper-parameter configurations (and
splits) trained together as one Pyro model, and streamed Monte-Carlo evaluation.

A run trains ``M`` independent *members* at once: member ``m`` is one (split, configuration)
pair. All weights live inside ``pyro.plate("members", M, dim=-2)``, so every weight site has
batch shape ``(M, 1)``; the guides give each member its own variational parameters, and the
Bayesian layers broadcast a member's weights over its own minibatch (inputs of shape
``(M, B, D)``). The members' objectives are independent sums, so one Adam step on the summed
loss is one Adam step of every member (Adam is element-wise, so a member's trajectory does not
depend on the others, nor on a constant factor in its own objective).

See :mod:`benchmarks.uci.protocol` for the protocol and the derivation of the
dropout guide's likelihood precision and prior.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch.distributions import constraints

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianLinear,
    ImproperLogUniform,
    local_reparameterization,
)
from pyro_dropout.guides import init_to_glorot
from pyro_dropout.infer import CompiledSVI, JitMeanFieldELBO, MeanFieldELBO, fused_adam, traced
from pyro_dropout.nn import HeteroscedasticGaussianLikelihood

from . import uci_fused

__all__ = [
    "GUIDES",
    "LENGTH_SCALE",
    "BatchedRegressionMLP",
    "GuideSpec",
    "build",
    "dropout_training_precision",
    "evaluate",
    "train",
]

#: Prior length-scale l of the UCI protocol.
LENGTH_SCALE = 1e-2
#: Slab scale σ of :class:`~pyro_dropout.AutoDropout` (Gal's Keras net is the σ → 0 limit).
DROPOUT_SLAB_SCALE = 1e-4
#: Prior scale of the biases under the dropout guide: effectively flat (Keras' Dense layers in
#: the reference net regularise the weights only).
DROPOUT_BIAS_PRIOR_SCALE = 1e6
#: Prior scale of the biases under the VD guide (standardised data); its weights get the
#: log-uniform prior, biases are not sparsified (Molchanov et al. 2017 keep them deterministic).
VD_BIAS_PRIOR_SCALE = 1.0
#: Initial noise SD (standardised scale) of members that learn their noise precision.
INIT_NOISE_SD = 0.1
#: Floor of the heteroscedastic members' noise scale (standardised targets).
HETERO_MIN_SCALE = 1e-3
#: Prior scales (standardised data) searched for the mean-field guide.
MEANFIELD_PRIOR_SCALES = (0.3, 1.0, 3.0)
#: Elements (c·M·N·width) per vectorised Monte-Carlo chunk: cache-sized passes are fastest on a
#: CPU (240 members x 91 rows: 2**20 took 0.69x the time of 2**23).
_CHUNK_BUDGET = 2**20
#: What one Monte-Carlo pass of :func:`evaluate` draws: one weight sample for all rows, or
#: fresh pre-activations per row (local reparameterisation).
MC_DRAWS = ("weights", "examples")
#: Steps per minibatch shape that ``JitMeanFieldELBO`` spends tracing (it traces the first two
#: calls and checks that the graphs agree) plus the first run of the traced graph.
_WARM_STEPS = 3


#: Each batched guide of a process gets its own name in Pyro's param store: several are alive at
#: once (validation and final phases, the hetero configurations), and a guide's default name is
#: its class name (pyro_dropout.guides.store_names).
_GUIDE_NUMBERS = itertools.count()


def _guide_name(kind):
    return f"uci_{kind}_{next(_GUIDE_NUMBERS)}"


def dropout_training_precision(tau, dropout_rate):
    r"""Likelihood precision τ' on the standardised targets that makes our ELBO, with prior
    ``Normal(0, 1/l)`` on the weights, equal to the reference Keras objective up to a constant
    factor: :math:`τ' = 2τ/(1-p)^2` (derivation in
    :mod:`benchmarks.uci.protocol`)."""
    return 2.0 * tau / (1.0 - dropout_rate) ** 2


def _member_normal(scale, shape):
    """``Normal(0, scale_m)`` over a parameter of ``shape``, batched as ``(M, 1)``."""
    scale = scale.reshape((-1, 1) + (1,) * len(shape))
    m = scale.shape[0]
    return dist.Normal(torch.zeros_like(scale), scale).expand((m, 1) + shape).to_event(len(shape))


class BatchedRegressionMLP(PyroModule):
    r"""``D – H (ReLU) – 1`` Bayesian MLP replicated over ``M`` members (plate at dim -2).

    ``forward(x, y=None, num_data=None)`` takes ``x`` of shape ``(M, B, D)`` and ``y`` of shape
    ``(M, B)`` (member ``m`` sees its own rows), observes
    ``y ~ Normal(f, noise_sd_m)`` inside ``pyro.plate("data", num_data, dim=-1)`` (scaled by
    ``num_data / B`` for minibatches) and returns ``f`` of shape ``(..., M, B)``.

    :param noise_sd: ``(M,)`` fixed noise SDs on the standardised scale; NaN marks a member
        whose noise SD is learned (a point estimate maximising its ELBO). Ignored when
        ``heteroscedastic``.
    :param weight_prior, bias_prior: per-layer prior as for :class:`BayesianLinear` (e.g.
        ``"learned"``: one empirical-Bayes scale per layer and member), or a ``(M,)`` tensor
        of Normal prior scales (one per member).
    :param bool heteroscedastic: the last layer has two outputs, the mean and the noise scale
        ``σ(x) = HETERO_MIN_SCALE + softplus(h + c)`` (``h = 0`` gives ``INIT_NOISE_SD``), as
        :class:`~pyro_dropout.nn.HeteroscedasticGaussianLikelihood`; ``forward`` then returns
        ``(..., M, B, 2)``: the mean and σ of every row (standardised scale).
    """

    max_plate_nesting = 2

    def __init__(self, d_in, n_hidden, noise_sd, weight_prior, bias_prior, heteroscedastic=False):
        super().__init__()
        noise_sd = torch.as_tensor(noise_sd, dtype=torch.get_default_dtype()).reshape(-1, 1)
        self.members = noise_sd.shape[0]
        self.heteroscedastic = bool(heteroscedastic)
        if self.heteroscedastic:
            noise_sd = torch.ones_like(noise_sd)  # unused
            self.likelihood = HeteroscedasticGaussianLikelihood(
                min_scale=HETERO_MIN_SCALE, init_scale=INIT_NOISE_SD
            )
        widths = ((d_in, n_hidden), (n_hidden, 2 if self.heteroscedastic else 1))
        layers = []
        for a, b in widths:
            layer = BayesianLinear(
                a,
                b,
                prior=None if torch.is_tensor(weight_prior) else weight_prior,
                bias_prior=None if torch.is_tensor(bias_prior) else bias_prior,
            )
            if torch.is_tensor(weight_prior):
                layer.weight = PyroSample(_member_normal(weight_prior, torch.Size((b, a))))
            if torch.is_tensor(bias_prior):
                layer.bias = PyroSample(_member_normal(bias_prior, torch.Size((b,))))
            layers.append(layer)
        self.layers = PyroModule[torch.nn.ModuleList](layers)
        learned = torch.isnan(noise_sd)
        self.register_buffer("learned", learned, persistent=False)
        self.register_buffer("fixed_sd", torch.where(learned, 1.0, noise_sd), persistent=False)
        if bool(learned.any()):
            self.learned_sd = PyroParam(
                torch.full_like(noise_sd, INIT_NOISE_SD), constraint=constraints.positive
            )
        else:
            self.learned_sd = None

    def noise_sd(self):
        """``(M, 1)`` noise SDs on the standardised scale (fixed or learned)."""
        if self.learned_sd is None:
            return self.fixed_sd
        return torch.where(self.learned, self.learned_sd, self.fixed_sd)

    def forward(self, x, y=None, num_data=None):
        with pyro.plate("members", self.members, dim=-2):
            h = torch.relu(self.layers[0](x))
            out = self.layers[1](h)
            if self.heteroscedastic:
                f, scale = self.likelihood.split(out)
                f, scale = f.squeeze(-1), scale.squeeze(-1)
            else:
                f, scale = out.squeeze(-1), self.noise_sd()
            n = f.shape[-1]
            size = n if num_data is None else int(num_data)
            subsample = None if size == n else torch.arange(n)
            with pyro.plate("data", size, subsample=subsample, dim=-1):
                pyro.sample("obs", dist.Normal(f, scale), obs=y)
        if self.heteroscedastic:
            return torch.stack([f, scale.expand_as(f)], -1)
        return f


# ------------------------------------------------------------------------------ guides
@dataclass(frozen=True)
class GuideSpec:
    """What the benchmark needs to know about one guide: its grid and how to build it."""

    name: str
    family: str
    description: str
    hyperparameters: tuple[str, ...]
    #: Learned noise in both phases; the validation LL picks a factor on the learned precision
    #: (:data:`TAU_CALIBRATION_FACTORS`) that the final fit's test LL applies to its own.
    calibrate_noise: bool = False


GUIDES = {
    "dropout": GuideSpec(
        "dropout",
        "AutoDropout",
        "MC dropout (Gal & Ghahramani 2016): dropout rate p x model precision tau from the "
        "dataset's grids, the reference net's objective (weight decay l^2(1-p)/(2 N tau), "
        "l = 0.01), test LL with the grid tau",
        ("dropout_rate", "tau"),
    ),
    "meanfield": GuideSpec(
        "meanfield",
        "AutoMeanField",
        "Bayes by Backprop (mean-field Gaussian): prior scale s in {0.3, 1, 3} (Normal(0, s^2) "
        "on all weights and biases, standardised data) x noise precision in {the dataset's tau "
        "grid, learned (point estimate maximising the ELBO)}",
        ("prior_scale", "noise"),
    ),
    "vd": GuideSpec(
        "vd",
        "AutoVariationalDropout",
        "Sparse variational dropout (one learned alpha per weight, log-uniform prior, Molchanov "
        "KL; biases Normal(0, 1)): noise precision in {the dataset's tau grid, learned (point "
        "estimate maximising the ELBO)}",
        ("noise",),
    ),
    "concrete": GuideSpec(
        "concrete",
        "AutoConcreteDropout",
        "Concrete dropout (Gal, Hron & Kendall 2017): one drop rate per layer learned by "
        "gradient (init 0.1, temperature 0.1), prior Normal(0, 1/l) on the weights (l = 0.01, "
        "biases flat, as the dropout guide), noise precision learned (point estimate "
        "maximising the ELBO); no grid, so no validation phase",
        (),
    ),
    "concrete-tau": GuideSpec(
        "concrete-tau",
        "AutoConcreteDropout",
        "Concrete dropout as `concrete` (drop rates and noise learned), with the test-time tau "
        "calibrated on the validation rows: the training on the sub-training rows picks the "
        "factor f in 10^[-2, 2] (81 values) on its learned precision with the best validation "
        "LL; the final fit's test LL uses f times its own learned precision",
        ("noise",),
        calibrate_noise=True,
    ),
}

#: Base guide of each "<guide>-hetero" configuration (issue 24).
HETERO_BASE = {
    "dropout-hetero": "dropout",
    "concrete-hetero": "concrete",
    "meanfield-hetero": "meanfield",
    "vd-hetero": "vd",
}
_HETERO_LIK = (
    "a heteroscedastic likelihood (the net predicts the mean and a noise scale per row, "
    "softplus with a floor of 1e-3, the scale head as Bayesian as the rest)"
)
_HETERO_TAIL = (
    ", with both of issue 24's ingredients: " + _HETERO_LIK + " and a learned prior scale per "
    "layer on the weights (empirical Bayes: the closed-form optimum mean E_q[w^2] emitted by "
    "the guide); no tau grid, the test LL is the mixture over draws of the predicted Gaussians"
)
#: The MC-dropout families: the likelihood only (see _build_hetero for why not the prior).
_HETERO_TAIL_FIXED = (
    ", with " + _HETERO_LIK + " and the base guide's fixed prior N(0, 1/l) (l = 0.01): a "
    "learned prior scale under a fixed posterior SD is ill-posed (the first layer shrinks to "
    "the slab); no tau grid, the test LL is the mixture over draws of the predicted Gaussians"
)
GUIDES.update(
    {
        "dropout-hetero": GuideSpec(
            "dropout-hetero",
            "AutoDropout",
            "MC dropout (slab 1e-4, flat biases) with the dataset's dropout-rate grid chosen "
            "by validation LL" + _HETERO_TAIL_FIXED,
            ("dropout_rate",),
        ),
        "concrete-hetero": GuideSpec(
            "concrete-hetero",
            "AutoConcreteDropout",
            "Concrete dropout (one rate per layer learned, slab 1e-4, flat biases; no grid, "
            "no validation phase)" + _HETERO_TAIL_FIXED,
            (),
        ),
        "meanfield-hetero": GuideSpec(
            "meanfield-hetero",
            "AutoMeanField",
            "Bayes by Backprop (biases Normal(0, 1); no grid, no validation phase)" + _HETERO_TAIL,
            (),
        ),
        "vd-hetero": GuideSpec(
            "vd-hetero",
            "AutoVariationalDropout",
            "Variational dropout, one alpha per weight, with a Normal prior (learned scale) "
            "in place of the log-uniform one (biases Normal(0, 1); no grid, no validation "
            "phase)" + _HETERO_TAIL,
            (),
        ),
    }
)

#: Factors on the learned precision scanned when ``concrete-tau`` calibrates the test-time τ on
#: the validation rows (log-spaced, 12 % apart: the validation LL is flat to well under a
#: standard error across one step).
TAU_CALIBRATION_FACTORS = torch.logspace(-2.0, 2.0, 81, dtype=torch.float64)


def grid(guide, dropout_rates, tau_values, quick=False):
    """The hyper-parameter configurations searched for ``guide`` (list of dicts).

    ``noise`` is a τ on the original target scale (a float) or ``"learned"``. The order is the
    reference code's loop order (dropout rate outer, τ inner); ties go to the first.
    ``quick`` keeps the first and last value of each axis (and drops fixed noise levels
    but the last for the Gaussian guides).
    """
    rates, taus = list(dropout_rates), list(tau_values)
    priors = list(MEANFIELD_PRIOR_SCALES)
    if quick:
        rates = sorted({rates[0], rates[-1]}, key=rates.index)
        taus = sorted({taus[0], taus[-1]}, key=taus.index)
        priors = [1.0]
    if guide == "dropout":
        return [{"dropout_rate": p, "tau": t} for p in rates for t in taus]
    if guide == "dropout-hetero":
        return [{"dropout_rate": p, "noise": "heteroscedastic"} for p in rates]
    if guide in HETERO_BASE:
        return [{"noise": "heteroscedastic"}]
    if guide in ("concrete", "concrete-tau"):
        # No grid: the drop rates (and, for "concrete", the noise) are learned, so one
        # training per split; "concrete-tau" calibrates τ on the validation rows after it.
        return [{"noise": "learned"}]
    noise = ([taus[-1]] if quick else taus) + ["learned"]
    if guide == "meanfield":
        return [{"prior_scale": s, "noise": n} for s in priors for n in noise]
    if guide == "vd":
        return [{"noise": n} for n in noise]
    raise ValueError(f"unknown guide {guide!r}; valid names are: {', '.join(GUIDES)}")


@dataclass
class Members:
    """The members of one batched fit: configuration, split and target SD of each."""

    configs: list[dict]
    y_std: torch.Tensor  # (M,) float64, target SD of each member's training rows
    n_train: int
    info: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.configs)


def build(guide, d_in, n_hidden, members: Members):
    """Model and guide for ``members`` (each member's configuration from :func:`grid`).

    Returns ``(model, guide, eval_tau)`` where ``eval_tau()`` gives the ``(M,)`` float64
    precisions on the original target scale used for the test log-likelihood (for learned
    noise: the learned precision mapped back with the member's target SD).
    """
    cfg = members.configs
    dtype = torch.get_default_dtype()
    y_var = members.y_std**2
    if guide in HETERO_BASE:
        return _build_hetero(guide, d_in, n_hidden, members)
    if guide == "dropout":
        rate = torch.tensor([c["dropout_rate"] for c in cfg], dtype=torch.float64)
        tau = torch.tensor([c["tau"] for c in cfg], dtype=torch.float64)
        noise_sd = dropout_training_precision(tau, rate) ** -0.5
        model = BatchedRegressionMLP(
            d_in,
            n_hidden,
            noise_sd.to(dtype),
            weight_prior=1.0 / LENGTH_SCALE,
            bias_prior=DROPOUT_BIAS_PRIOR_SCALE,
        )
        g = AutoDropout(
            model,
            dropout_rate=rate.to(dtype).reshape(-1, 1, 1, 1),
            input_dropout_rate=rate.to(dtype).reshape(-1, 1, 1, 1),  # Gal's: inputs too
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("dropout"),
        )
        return model, g, lambda: tau.clone()

    noise = [c["noise"] for c in cfg]
    fixed_tau = torch.tensor([math.nan if n == "learned" else float(n) for n in noise]).double()
    noise_sd = (fixed_tau * y_var) ** -0.5  # NaN stays NaN: learned
    if guide == "meanfield":
        prior = torch.tensor([c["prior_scale"] for c in cfg], dtype=dtype)
        model = BatchedRegressionMLP(d_in, n_hidden, noise_sd.to(dtype), prior, prior)
        g = AutoMeanField(model, init_loc_fn=init_to_glorot, name=_guide_name("meanfield"))
    elif guide in ("concrete", "concrete-tau"):
        model = BatchedRegressionMLP(
            d_in,
            n_hidden,
            noise_sd.to(dtype),
            weight_prior=1.0 / LENGTH_SCALE,
            bias_prior=DROPOUT_BIAS_PRIOR_SCALE,
        )
        g = AutoConcreteDropout(
            model,
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("concrete"),
        )
    elif guide == "vd":
        model = BatchedRegressionMLP(
            d_in, n_hidden, noise_sd.to(dtype), ImproperLogUniform(), VD_BIAS_PRIOR_SCALE
        )
        g = AutoVariationalDropout(
            model, alpha="weight", init_loc_fn=init_to_glorot, name=_guide_name("vd")
        )
    else:
        raise ValueError(f"unknown guide {guide!r}; valid names are: {', '.join(GUIDES)}")

    def eval_tau():
        sd = model.noise_sd().detach().double().reshape(-1).to(y_var.device)
        return 1.0 / (sd**2 * y_var)

    return model, g, eval_tau


def _build_hetero(guide, d_in, n_hidden, members):
    """The "<guide>-hetero" members: heteroscedastic outputs and a learned prior scale per
    layer on the weights (:class:`~pyro_dropout.nn.LearnedPrior`); ``eval_tau`` gives NaN
    before evaluation (the test LL uses each draw's predicted scale, and the recorded τ is
    :func:`evaluate`'s summary of the predicted noise)."""
    cfg = members.configs
    dtype = torch.get_default_dtype()
    m = len(cfg)
    base = HETERO_BASE[guide]
    fixed_slab = base in ("dropout", "concrete")
    bias = DROPOUT_BIAS_PRIOR_SCALE if fixed_slab else VD_BIAS_PRIOR_SCALE
    # The MC-dropout families keep their base guide's fixed prior N(0, 1/l). With the posterior
    # SD fixed at the slab σ = 1e-4, a learned per-layer scale profiles the KL to
    # (K/2) log mean(E_q[w²]) per layer; rescaling the ReLU layers (first × c, second × 1/c)
    # leaves the function alone and lowers that KL by (K1 - K2) log(1/c) (K1 = 8·50 > K2 = 50·2)
    # until the first layer's weights reach σ: about 2300 nats to gain (weights of SD 0.3) by
    # shrinking it to the slab's noise floor. The Gaussian families learn their posterior SDs,
    # so their profiled KL does not change under that rescaling.
    weight_prior = 1.0 / LENGTH_SCALE if fixed_slab else "learned"
    model = BatchedRegressionMLP(
        d_in, n_hidden, torch.ones(m, dtype=dtype), weight_prior, bias, heteroscedastic=True
    )
    if base == "dropout":
        rate = torch.tensor([c["dropout_rate"] for c in cfg], dtype=dtype)
        g = AutoDropout(
            model,
            dropout_rate=rate.reshape(-1, 1, 1, 1),
            input_dropout_rate=rate.reshape(-1, 1, 1, 1),  # as the homoscedastic members
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("dropout"),
        )
    elif base == "concrete":
        g = AutoConcreteDropout(
            model,
            scale=DROPOUT_SLAB_SCALE,
            init_loc_fn=init_to_glorot,
            name=_guide_name("concrete"),
        )
    elif base == "meanfield":
        g = AutoMeanField(model, init_loc_fn=init_to_glorot, name=_guide_name("meanfield"))
    else:
        g = AutoVariationalDropout(
            model, alpha="weight", init_loc_fn=init_to_glorot, name=_guide_name("vd")
        )
    return model, g, lambda: torch.full((m,), math.nan, dtype=torch.float64)


# ---------------------------------------------------------------------------- training
def _expand_members(t, per_split):
    """``(S, ...)`` -> ``(S * per_split, ...)``, member-major within each split."""
    if per_split == 1:
        return t
    return t.unsqueeze(1).expand((t.shape[0], per_split) + t.shape[1:]).flatten(0, 1)


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
    #: kernels), ``"traced"`` (``JitMeanFieldELBO``) or ``"eager"`` (``MeanFieldELBO``).
    engine: str = "traced"

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
):
    """Fit ``guide`` with ``MeanFieldELBO`` + local reparameterisation + Adam.

    :param x: ``(S, N, D)`` standardised inputs of S splits (equal N), :param y: ``(S, N)``.
    :param per_split: members per split (members are ordered split-major).
    Minibatches: one random permutation of the N row positions per epoch, shared by all
    members (each split permutes its own rows); the last batch of an epoch is smaller, as in
    Keras. The likelihood is scaled by ``N / B``, the KL counted once per step.
    :param max_steps: stop early (timing runs).
    :param jit: use :class:`~pyro_dropout.infer.JitMeanFieldELBO` (one trace per minibatch
        shape), run by TorchScript's unoptimised executor. The same estimator as the eager
        ``MeanFieldELBO``, but not the same random stream: the traced graph drops the guide's
        weight draws that local reparameterisation leaves unused.
    :param fused: one fused Adam over all parameters (:func:`~pyro_dropout.infer.fused_adam`,
        the same update as ``pyro.optim.Adam``).
    :param kernels: train with :func:`~benchmarks.uci_fused.fused_loss`
        (mean-field, variational dropout, MC dropout and Concrete dropout)
        (the same loss as the traced one given the same noise, from numba kernels): ``None``
        (the default) when ``jit`` and it supports the pair on CPU tensors, ``True`` always
        (``ValueError`` naming why not), ``False`` never.
    """
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    n = x.shape[1]
    steps_per_epoch = math.ceil(n / batch_size)
    total = num_epochs * steps_per_epoch if max_steps is None else max_steps
    optim = fused_adam({"lr": lr}) if fused else pyro.optim.Adam({"lr": lr})
    if kernels is None:  # compiled training: the kernels where they apply
        kernels = jit and x.device.type == "cpu" and uci_fused.supports(model, guide)
    elif kernels and not uci_fused.supports(model, guide):
        raise ValueError(f"kernels=True: {uci_fused.unsupported_reason(model, guide)}")
    if kernels:
        engine = "fused"
        svi = uci_fused.FusedSVI(model, guide, optim)
    else:
        engine = "traced" if jit else "eager"
        elbo = (JitMeanFieldELBO if jit else MeanFieldELBO)(
            max_plate_nesting=model.max_plate_nesting
        )
        svi = CompiledSVI(model, guide, optim, elbo)  # SVI.step where not compiled and fused
    loss = math.nan
    order = None
    seen, warm_steps, compile_s = {}, 0, 0.0
    start = time.perf_counter()
    # The graph executor's optimisations (differentiable subgraphs; no fusion on CPU) made
    # the compiled step slower than eager on large steps; unoptimised it is the fastest
    # (kin8nm, dropout, one thread, ms/step eager / optimised / unoptimised: 240 members
    # 37.1 / 39.3 / 32.2, 20 members 5.3 / 3.2 / 3.0).
    with (
        pyro.validation_enabled(False),
        local_reparameterization(),
        torch.jit.optimized_execution(not jit),
    ):
        for step in range(total):
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
    return FitStats(
        total, time.perf_counter() - start, float(loss), compile_s, warm_steps, jit, engine
    )


# -------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    """Per-member test metrics on the original target scale (``(M,)`` float64 tensors)."""

    rmse: torch.Tensor
    ll: torch.Tensor
    rmse_mean_weights: torch.Tensor
    tau: torch.Tensor
    wall_s: float
    samples: torch.Tensor | None = None  # (T, M, N) original scale, if requested
    #: ``(K, M)`` LL with each member's τ multiplied by ``tau_factors[k]``, if requested
    ll_scan: torch.Tensor | None = None
    #: Of ``wall_s``, seconds spent in the first (tracing) call of each compiled draw, and
    #: the Monte-Carlo samples those calls drew.
    compile_s: float = 0.0
    compile_samples: int = 0


def _eval_blocks(m, n, width, num_samples, budget):
    """``(rows, chunk)``: rows per block and Monte-Carlo samples per chunk, so that one
    vectorised pass holds at most ``budget`` elements (``chunk · M · rows · width``)."""
    per_row = max(1, m * width)
    rows = max(1, min(n, budget // per_row))
    chunk = max(1, min(num_samples, budget // (per_row * rows)))
    return rows, chunk


class _Draw:
    """One vectorised Monte-Carlo draw ``f`` of shape ``(c, M, N)``: the guide traced once, the
    model replayed on it block by block of ``rows`` rows. Blocks keep each replay cache-sized.

    * ``draws="weights"``: every block reads the guide's weight draws, so one pass applies one
      draw of the weights to all rows, as in one full pass;
    * ``draws="examples"``: under ``local_reparameterization()`` each replay draws fresh
      pre-activations per example (the guide's weight draws are unused), so the blocks are
      independent draws exactly as in one full pass.

    With ``jit``, one TorchScript trace per ``(c, input shape, rows)``
    (:func:`pyro.ops.jit.trace`): the traced graph draws fresh random numbers on each call but
    skips Pyro's Python-level effect handling."""

    def __init__(self, model, guide, jit):
        self.model, self.guide, self.jit = model, guide, jit
        self._compiled = {}
        self.compile_s = 0.0
        self.compile_samples = 0

    def _eager(self, x, c, rows):
        m, n = x.shape[0], x.shape[1]
        with pyro.plate("_mc_samples", c, dim=-3):
            trace = poutine.trace(self.guide).get_trace(x[:, :rows])
            model = poutine.replay(self.model, trace=trace)
            tail = (2,) if getattr(self.model, "heteroscedastic", False) else ()
            parts = [
                model(x[:, r0 : r0 + rows]).reshape(c, m, -1, *tail) for r0 in range(0, n, rows)
            ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)

    def __call__(self, x, c, rows):
        if not self.jit:
            return self._eager(x, c, rows)
        key = (c, tuple(x.shape), rows)
        fn = self._compiled.get(key)
        first = fn is None
        if first:
            fn = self._compiled[key] = traced.trace(
                lambda x: self._eager(x, c, rows), ignore_warnings=True
            )
            t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
            f = fn(x)
        if first:
            self.compile_s += time.perf_counter() - t0
            self.compile_samples += c
        return f


@torch.no_grad()
def evaluate(
    model,
    guide,
    x,
    y,
    per_split,
    y_mean,
    y_std,
    tau,
    num_samples,
    seed=0,
    keep_samples=False,
    tau_factors=None,
    jit=True,
    budget=None,
    draws="weights",
    kernels=None,
):
    r"""MC-dropout style test metrics of every member, streamed over chunks of samples.

    ``x``: ``(S, N, D)`` inputs standardised with the members' training statistics; ``y``:
    ``(S, N)`` targets on the *original* scale; ``y_mean``, ``y_std``, ``tau``: ``(M,)``.
    Each of the T passes samples fresh pre-activations (local reparameterisation: for the
    dropout guide a fresh dropout mask per example, exactly MC dropout). Predictions are
    un-normalised first; then (float64)

    * RMSE of the MC mean ``(1/T) Σ_t ŷ_t``;
    * LL_i = logsumexp_t(-τ/2 (y_i - ŷ_t)²) - log T - ½ log 2π + ½ log τ, averaged over i
      (``Prediction.log_likelihood``'s formula; the logsumexp is accumulated chunk by chunk);
    * ``rmse_mean_weights``: RMSE of the network with the posterior-mean weights (for dropout,
      standard dropout's weight-averaging test-time net; the reference code's "standard" RMSE);
    * heteroscedastic members (``model.heteroscedastic``): each pass gives a mean and a
      scale per row, the LL is the mixture logsumexp_t log N(y_i; μ_t, σ_t) − log T (``tau``
      unused) and ``Evaluation.tau`` records 1 / (mean over passes and rows of σ²), the
      precision of the average predicted noise (a summary only);
    * ``ll_scan`` (if ``tau_factors``, a ``(K,)`` tensor): the same LL with τ replaced by
      ``tau_factors[k] · τ``, from the same passes (for calibrating τ on validation rows).

    ``draws``: what one pass draws (:data:`MC_DRAWS`).

    * ``"weights"`` (default): one draw of the weights from the guide, applied to every row;
    * ``"examples"``: under local reparameterisation, fresh pre-activations for every row (for
      the dropout guide a fresh mask per example, as Keras' MC dropout in the reference code).

    For any one row the T draws have the same distribution either way (independent draws of
    the posterior predictive; local reparameterisation samples each row's pre-activations from
    their exact marginal), so the per-row LL and the MC mean estimate the same quantities;
    only the correlation *between* rows of a pass differs, which the row averages feel as a
    slightly different Monte-Carlo error (negligible at T = 10,000). ``"weights"`` draws 559
    random numbers per member and pass for 8-50-1 where ``"examples"`` draws 109 per row
    (kin8nm validation: 5x faster).

    Passes are vectorised over chunks of samples and, when one pass of all rows exceeds
    ``budget`` elements (default :data:`_CHUNK_BUDGET`), split into blocks of rows; a block of
    rows is drawn exactly as in a full pass (other random numbers, the same distribution).
    ``jit``: run each pass through a traced graph (see :class:`_Draw`).
    ``kernels``: weight draws through :class:`~benchmarks.uci_fused.FusedDraw`
    (the guide's weights, the forward in a numba kernel, all rows at once): ``None`` (the
    default) where it applies (``jit``, weight draws, one output, CPU tensors, numba
    installed), ``True`` always (``ValueError`` naming why not), ``False`` never.
    """
    if draws not in MC_DRAWS:
        raise ValueError(f"evaluate: draws must be one of {MC_DRAWS}, got {draws!r}")
    start = time.perf_counter()
    pyro.set_rng_seed(seed)
    xm = _expand_members(x, per_split)
    ym = _expand_members(y.double(), per_split)
    m, n = ym.shape
    dev = ym.device
    mu = y_mean.double().reshape(m, 1).to(dev)
    sd = y_std.double().reshape(m, 1).to(dev)
    tau = tau.double().reshape(m, 1).to(dev)
    hetero = getattr(model, "heteroscedastic", False)
    width = xm.shape[-1] + sum(layer.out_features for layer in model.layers)
    budget = _CHUNK_BUDGET if budget is None else budget
    rows, chunk = _eval_blocks(m, n, width, num_samples, budget)
    if kernels is None:
        kernels = (
            jit and draws == "weights" and dev.type == "cpu" and uci_fused.predict_supports(model)
        )
    if kernels:
        if draws != "weights":
            raise ValueError("evaluate(kernels=True) draws weights: pass draws='weights'")
        draw = uci_fused.FusedDraw(model, guide)  # ValueError naming why not
        # the kernel streams the rows: chunks of passes whose (c, M, N) draws fit the budget
        rows, chunk = n, max(1, min(num_samples, budget // max(1, m * n)))
    else:
        draw = _Draw(model, guide, jit)
    total = torch.zeros(m, n, dtype=torch.float64, device=dev)
    lse = torch.full((m, n), -math.inf, dtype=torch.float64, device=dev)
    noise_var = torch.zeros(m, dtype=torch.float64, device=dev)  # heteroscedastic: Σ σ²
    factors = None if tau_factors is None else tau_factors.double().to(dev)
    if factors is not None:
        lse_scan = torch.full((len(factors), m, n), -math.inf, dtype=torch.float64, device=dev)
    kept = []
    with (
        pyro.validation_enabled(False),
        # weight draws: the guide's weights, no pre-activation sampling
        local_reparameterization() if draws == "examples" else contextlib.nullcontext(),
        torch.jit.optimized_execution(not jit),  # as in train(): no gain from it here
    ):
        for s0 in range(0, num_samples, chunk):
            c = min(chunk, num_samples - s0)
            if hetero:  # each draw's own Gaussian: the mixture LL, no τ
                out = draw(xm, c, rows).double()
                f, s_f = out[..., 0] * sd + mu, out[..., 1] * sd
                total += f.sum(0)
                log_n = -0.5 * ((ym - f) / s_f) ** 2 - s_f.log()
                noise_var += (s_f**2).sum((0, -1))
                lse = torch.logaddexp(lse, torch.logsumexp(log_n, 0))
                if keep_samples:
                    kept.append(f)
                continue
            f = draw(xm, c, rows).double() * sd + mu
            total += f.sum(0)
            sq = (ym - f) ** 2
            lse = torch.logaddexp(lse, torch.logsumexp(-0.5 * tau * sq, 0))
            if factors is not None:  # one τ at a time: K x chunk x M x N would not fit
                for k, fac in enumerate(factors):
                    lse_scan[k] = torch.logaddexp(
                        lse_scan[k], torch.logsumexp(-0.5 * fac * tau * sq, 0)
                    )
            if keep_samples:
                kept.append(f)
    mean = total / num_samples
    rmse = ((ym - mean) ** 2).mean(-1).sqrt()
    const = -math.log(num_samples) - 0.5 * math.log(2 * math.pi)
    ll_i = lse + const + (0.0 if hetero else 0.5 * tau.log())
    if hetero:  # the recorded τ: the precision of the mean predicted noise variance
        tau = (num_samples * n / noise_var).reshape(m, 1)
    ll_scan = None
    if factors is not None:
        ll_scan = (lse_scan + const + 0.5 * (factors.reshape(-1, 1, 1) * tau).log()).mean(-1)
    with pyro.validation_enabled(False):
        medians = guide.median()
        f_mw = poutine.condition(model, data=medians)(xm)
        f_mean_w = (f_mw[..., 0] if hetero else f_mw).reshape(m, n).double() * sd + mu
    rmse_mw = ((ym - f_mean_w) ** 2).mean(-1).sqrt()
    return Evaluation(
        rmse=rmse,
        ll=ll_i.mean(-1),
        rmse_mean_weights=rmse_mw,
        tau=tau.reshape(-1),
        wall_s=time.perf_counter() - start,
        samples=torch.cat(kept, 0) if keep_samples else None,
        ll_scan=ll_scan,
        compile_s=draw.compile_s,
        compile_samples=draw.compile_samples,
    )

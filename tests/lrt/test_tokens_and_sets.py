"""A Linear layer on a ``(B, T, d)`` input: one weight draw serves all ``T`` tokens of an example.

Under q the ``T`` tokens of one example (a sequence, a set) meet the *same* weight, so their
pre-activations are correlated; before this was fixed (b220d6f) the handler drew them
independently per token: ten identical tokens, mean-pooled, had a tenth of q's variance, and a
DeepSets model's −ELBO under local reparameterisation was far from the true one.

Checked here, against weight sampling (``W ~ q`` applied with plain ``torch.einsum``):

* jointly over one example's tokens (the means and the full covariance matrix of its ``T × H``
  outputs) and independence across examples, for the four families (mean-field Normal,
  variational dropout's ``LogAlphaNormal``, ``BernoulliMaskedNormal``, ``ConcreteMaskedNormal``
  hard and relaxed) and every way a weight meets a token input (``BayesianLinear``,
  ``PyroModule[nn.Linear]``, ``F.linear``, ``x @ w.T``, ``torch.matmul``, ``x @ w``), with
  ``R = 4000`` draws and ``|z| < 5`` (``_stats.Z``); the same check rejects per-token LRT
  (``estimator="lrt"`` on the Normal family) at ``|z| > 10``;
* the measured repro: ten identical tokens, mean-pooled, have q's variance for the four guides;
* hand-written attention and DeepSets mean pooling: moments of the output, and the DeepSets
  −ELBO under LRT against the weight-draw −ELBO in expectation;
* never silent: ``torch.einsum`` (no rule) warns, and a plate that contradicts the
  "example axis first" reading falls back to weight draws with a warning naming the site
  (``strict=True`` raises);
* ``(B, d)`` inputs keep the per-unit LRT path (no token dims in the spec).
"""

import contextlib
import warnings

import hypothesis.strategies as st
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from pyro import poutine
from pyro.nn import PyroModule, PyroSample

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianLinear,
    BernoulliMaskedNormal,
    ConcreteMaskedNormal,
    fit,
    local_reparameterization,
    weight_draws,
)
from pyro_dropout.distributions import LogAlphaNormal
from pyro_dropout.handlers import LocalReparameterizationWarning, registry
from pyro_dropout.nn.functional import LinearSpec, token_layout
from pyro_dropout.nn.guided_value import plain

from ._stats import Z, cov_products, log_var_ratio_z, max_abs, mean_z, one_sample_z

#: Draws per estimate. One example's output has T * H = 6 numbers (36 covariance entries, 2
#: examples), so the family-wise false-alarm rate at Z = 5 is ~1e-4 per test, and tests are seeded.
R = 4000
K, T, D, H = 2, 3, 3, 2

FAMILIES = ("normal", "vd", "dropout", "concrete_hard", "concrete_relaxed")


def _q(family, shape, seed=5):
    """The weight's guide distribution (dropout rates differing between the units the mask is
    shared over, so a rule that permutes or re-tiles masks gives other moments)."""
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g)
    if family == "normal":
        return dist.Normal(0.5 * loc, 0.2 + 0.4 * torch.rand(shape, generator=g)).to_event(2)
    if family == "vd":
        return LogAlphaNormal(loc, torch.empty(shape).uniform_(-1.5, 0.0, generator=g)).to_event(2)
    rate = torch.linspace(0.2, 0.5, shape[1]).reshape(1, shape[1])
    if family == "dropout":
        return BernoulliMaskedNormal(loc, 0.2, rate, event_dim=2)
    relaxed = family == "concrete_relaxed"
    return ConcreteMaskedNormal(loc, 0.2, rate, 0.5, relaxed=relaxed, event_dim=2)


def _qb(seed=6):
    g = torch.Generator().manual_seed(seed)
    return dist.Normal(0.3 * torch.randn(H, generator=g), torch.full((H,), 0.3)).to_event(1)


def _prior(shape):
    return dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape))


class _Functional:
    """A functional model applying the weight site ``weight`` (and ``bias``) to ``x``."""

    def __init__(self, apply, transposed=False, bias=False):
        self.apply, self.transposed, self.bias = apply, transposed, bias
        self.weight_shape = (D, H) if transposed else (H, D)

    def __call__(self, x):
        w = pyro.sample("weight", _prior(self.weight_shape))
        b = pyro.sample("bias", _prior((H,))) if self.bias else None
        return self.apply(x, w, b)


def _pyro_linear():
    lin = PyroModule[torch.nn.Linear](D, H)
    lin.weight = PyroSample(_prior((H, D)))
    lin.bias = PyroSample(_prior((H,)))
    lin.weight_shape, lin.transposed = (H, D), False
    return lin


def _bayesian_linear():
    layer = BayesianLinear(D, H)
    layer.transposed = False
    return layer


FORMS = {
    "BayesianLinear": _bayesian_linear,
    "PyroModule[nn.Linear]": _pyro_linear,
    "F.linear": lambda: _Functional(lambda x, w, b: F.linear(x, w, b), bias=True),
    "x @ w.T": lambda: _Functional(lambda x, w, b: x @ w.T),
    "torch.matmul": lambda: _Functional(lambda x, w, b: torch.matmul(x, w.T)),
    "x @ w (in, out)": lambda: _Functional(lambda x, w, b: x @ w, transposed=True),
}
HAS_BIAS = {"BayesianLinear", "PyroModule[nn.Linear]", "F.linear"}


def _tokens():
    """``K = 2`` examples of ``T = 3`` tokens: two equal tokens, one with a zero unit."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(K, T, D, generator=g)
    x[:, 1] = x[:, 0]
    x[1, 2, 0] = 0.0
    return x


def _guide(dists):
    def guide(*args, **kwargs):
        for name, d in dists.items():
            pyro.sample(name, d)

    return guide


def _draws(model, guide, x, handler, r=R, *args):
    """``r`` outputs in one pass: a draws plate left of the example and token dims."""
    with handler(), pyro.plate("draws", r, dim=-3), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x, *args)
        return poutine.replay(model, trace=tr)(x, *args)


def _reference(dists, x, transposed, r=R):
    """``r`` outputs of weights drawn by the family's own ``rsample``: ``(r, K, T, H)``."""
    with torch.no_grad():
        w = dists["weight"].rsample((r,))
        out = torch.einsum("sio,kti->skto" if transposed else "soi,kti->skto", w, x)
        if "bias" in dists:
            out = out + dists["bias"].rsample((r,))[:, None, None, :]
        return out


def _joint_z(got, ref):
    """Worst |z| of the means, of each example's covariance matrix over its tokens and units
    against weight sampling, and of the covariance across the two examples against 0."""
    got, ref = got.flatten(2), ref.flatten(2)  # (R, K, T * H)
    c = got.double() - got.double().mean(0)
    return {
        "mean": max_abs(mean_z(got.flatten(1), ref.flatten(1))),
        "cov within example": max(
            max_abs(mean_z(cov_products(got[:, k]), cov_products(ref[:, k])))
            for k in range(got.shape[1])
        ),
        "cov across examples vs 0": max_abs(
            one_sample_z(c[:, 0, :, None] * c[:, 1, None, :], torch.zeros(()))
        ),
    }


def _case(family, form):
    layer = FORMS[form]()
    dists = {"weight": _q(family, layer.weight_shape)}
    if form in HAS_BIAS:
        dists["bias"] = _qb()
    return layer, dists


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_of_one_example_share_the_weight_draw(family, form):
    layer, dists = _case(family, form)
    x = _tokens()
    pyro.set_rng_seed(0)
    got = _draws(layer, _guide(dists), x, local_reparameterization)
    ref = _reference(dists, x, layer.transposed)
    worst = _joint_z(got, ref)
    assert max(worst.values()) < Z, f"{family}/{form}: max |z| {worst}"


@pytest.mark.parametrize(
    ("family", "estimator"),
    [
        ("normal", "flipout"),
        ("normal", "per_example"),
        ("dropout", "per_example"),
        ("dropout", "lrt"),  # the masked families' rules share masks and slab over tokens
        ("concrete_relaxed", "lrt"),
    ],
)
def test_the_explicit_exact_estimators_share_the_draw_too(family, estimator):
    layer, dists = _case(family, "F.linear")
    x = _tokens()
    pyro.set_rng_seed(1)
    got = _draws(layer, _guide(dists), x, lambda: local_reparameterization(estimator=estimator))
    worst = _joint_z(got, _reference(dists, x, False))
    assert max(worst.values()) < Z, f"{family}/{estimator}: max |z| {worst}"


def test_the_joint_check_rejects_per_token_noise():
    """``estimator="lrt"`` on the Normal family samples each token from its marginal (what
    ``"auto"`` did before): right means, but the two equal tokens are uncorrelated where q
    makes them identical. The check above must see it."""
    layer, dists = _case("normal", "F.linear")
    x = _tokens()
    pyro.set_rng_seed(2)
    got = _draws(layer, _guide(dists), x, lambda: local_reparameterization(estimator="lrt"))
    worst = _joint_z(got, _reference(dists, x, False))
    assert worst["mean"] < Z
    assert worst["cov within example"] > 4 * Z, worst  # measured: 38


# --------------------------------------------------------------------------------------------
# the measured repro: ten identical tokens, mean-pooled, with the library's guides
# --------------------------------------------------------------------------------------------

GUIDES = {
    "mean_field": lambda m: AutoMeanField(m, init_scale=0.3),
    "variational_dropout": lambda m: AutoVariationalDropout(m, init_log_alpha=-1.0),
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.3, input_dropout_rate=0.3, scale=0.1),
    "concrete_dropout": lambda m: AutoConcreteDropout(m, init_rate=0.3, scale=0.1),
}


class _Pooled(PyroModule):
    """``PyroModule[nn.Linear]`` on a set of tokens, mean-pooled, a Normal likelihood."""

    def __init__(self, d=D, h=4):
        super().__init__()
        self.lin = PyroModule[torch.nn.Linear](d, h)
        self.lin.weight = PyroSample(_prior((h, d)))
        self.lin.bias = PyroSample(_prior((h,)))

    def forward(self, x, y=None):
        f = self.lin(x).mean(-2)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 1.0).to_event(1), obs=y)
        return f


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
def test_ten_identical_tokens_mean_pooled_have_the_variance_of_q(guide_name):
    """Measured on b220d6f: the pooled variance was 1/9-1/11 of q's (log-ratio z ≈ -60)."""
    model = _Pooled()
    x = torch.randn(1, 1, D).expand(2, 10, D)
    guide = GUIDES[guide_name](model)
    y = torch.zeros(2, 4)  # observed, so that the likelihood draws nothing
    guide(x, y)
    lrt = _draws(model, guide, x, local_reparameterization, 3000, y)
    ref = _draws(model, guide, x, weight_draws, 3000, y)
    for unit in range(4):
        z = log_var_ratio_z(lrt[:, 0, unit], ref[:, 0, unit])
        assert abs(z) < Z, f"unit {unit}: var ratio {lrt[:, 0, unit].var() / ref[:, 0, unit].var()}"


# --------------------------------------------------------------------------------------------
# attention and DeepSets
# --------------------------------------------------------------------------------------------


def _attention(x):
    """One head of self-attention, written by hand, mean-pooled over the tokens."""
    wq = pyro.sample("wq", _prior((H, D)))
    wk = pyro.sample("wk", _prior((H, D)))
    wv = pyro.sample("wv", _prior((H, D)))
    q, k, v = x @ wq.T, x @ wk.T, F.linear(x, wv)
    att = torch.softmax(q @ k.transpose(-1, -2) / H**0.5, dim=-1)
    return (att @ v).mean(-2)


def test_hand_written_attention_matches_weight_sampling():
    x = _tokens()
    dists = {name: _q("normal", (H, D), seed=s) for s, name in enumerate(("wq", "wk", "wv"))}
    pyro.set_rng_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LocalReparameterizationWarning)
        got = _draws(_attention, _guide(dists), x, local_reparameterization)
    ref = _draws(_attention, _guide(dists), x, weight_draws)  # (R, K, H)
    assert max_abs(mean_z(got.flatten(1), ref.flatten(1))) < Z
    for k in range(K):
        assert max_abs(mean_z(cov_products(got[:, k]), cov_products(ref[:, k]))) < Z


class _DeepSets(PyroModule):
    """phi (Linear + tanh) on each element, mean over the set, rho (Linear) on the mean."""

    def __init__(self, d=2, h=8, n_sets=None):
        super().__init__()
        self.phi = PyroModule[torch.nn.Linear](d, h)
        self.phi.weight = PyroSample(_prior((h, d)))
        self.phi.bias = PyroSample(_prior((h,)))
        self.rho = PyroModule[torch.nn.Linear](h, 1)
        self.rho.weight = PyroSample(_prior((1, h)))
        self.rho.bias = PyroSample(_prior((1,)))

    def forward(self, x, y=None):
        f = self.rho(torch.tanh(self.phi(x)).mean(-2)).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 0.1), obs=y)
        return f


def _sets(n=16, t=30, d=2, seed=0):
    """``n`` sets of ``t`` elements scattered around a centre per set; the target is a
    function of the centre. (Elements of zero mean would let the weight noise average out
    over a set whether or not it is shared.)"""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(n, 1, d, generator=g)
    x = centre + 0.3 * torch.randn(n, t, d, generator=g)
    return x, torch.tanh(centre.sum((-1, -2)))


def test_deepsets_elbo_under_lrt_matches_the_weight_draw_elbo():
    """The −ELBO ``fit`` optimises (under local reparameterisation) has the expectation of the
    true one (weight draws) at the same parameters. The guide has noisy ``phi`` weights (σ = 1)
    and targets fitted by q's mean, so the expected log-likelihood is that of q's noise on the
    pooled features. Measured on b220d6f: 234 against 2751 ± 257 (means of 100 estimates
    each, z = -9.8); here 2657 against 2350 (z = 1.3)."""
    model = _DeepSets()
    x, y = _sets()
    guide = AutoMeanField(model, init_scale=0.01)
    guide(x, y)
    params = dict(guide.named_parameters())
    with torch.no_grad():  # unconstrained values: softplus(0.5413) = 1.0
        params["scales.phi.weight_unconstrained"].fill_(0.5413)
        params["locs.rho.weight_unconstrained"].fill_(1.0)
    with torch.no_grad():
        y = poutine.condition(model, data=guide.median(x, y))(x)
    elbo = pyro.infer.TraceMeanField_ELBO()
    losses = {}
    for handler in (local_reparameterization, weight_draws):
        with handler(), torch.no_grad():
            losses[handler.__name__] = torch.tensor(
                [elbo.loss(model, guide, x, y) for _ in range(100)]
            )
    lrt, ref = losses["local_reparameterization"], losses["weight_draws"]
    assert abs(float(mean_z(lrt[:, None], ref[:, None]))) < Z, (lrt.mean(), ref.mean())


def test_fit_of_a_token_model_compiles_and_trains():
    """``fit``'s default (``jit="auto"``) traces the handler on a token model: it trains,
    without a warning (a ``CompilationWarning`` would say it fell back to eager steps)."""
    model = _DeepSets()
    x, y = _sets()
    guide = AutoMeanField(model, init_scale=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = fit(model, guide, x, y, num_steps=60, lr=0.02, progress=False, seed=0)
    losses = torch.as_tensor(losses)
    assert torch.isfinite(losses).all()
    assert losses[-10:].mean() < losses[:10].mean()


# --------------------------------------------------------------------------------------------
# never silent
# --------------------------------------------------------------------------------------------


def _einsum(x):
    w = pyro.sample("weight", _prior((H, D)))
    return torch.einsum("ktd,hd->kth", x, w)


def _traced(model, dists, handler, *args):
    """One run of the guide and the model under ``handler``: (output, drawn weight)."""
    with handler:
        tr = poutine.trace(_guide(dists)).get_trace()
        out = poutine.replay(model, trace=tr)(*args)
    return out, plain(tr.nodes["weight"]["value"])


def test_einsum_has_no_rule_and_warns_rather_than_drawing_per_token():
    dists = {"weight": _q("normal", (H, D))}
    x = _tokens()
    with pytest.warns(LocalReparameterizationWarning, match=r"'weight'.*einsum"):
        out, w = _traced(_einsum, dists, local_reparameterization(), x)
    # used as drawn: one weight for both examples and all their tokens
    torch.testing.assert_close(out, x @ w.T)
    with pytest.raises(NotImplementedError, match=r"'weight'.*einsum"):
        _traced(_einsum, dists, local_reparameterization(strict=True), x)


def _plated(x, plate_size):
    w = pyro.sample("weight", _prior((H, D)))
    with pyro.plate("tokens", plate_size, dim=-1):
        return x @ w.T


@pytest.mark.parametrize(
    "layout", ["plate over the tokens", "input laid out (T, B, d)", "plate over neither"]
)
def test_a_plate_that_contradicts_the_example_axis_warns_and_uses_weight_draws(layout):
    x = _tokens()  # (K=2, T=3, D)
    plate_size = {"plate over the tokens": T, "plate over neither": 5}.get(layout, K)
    if layout == "input laid out (T, B, d)":
        x = x.transpose(0, 1)  # (T, K, D) inside a plate over the K examples
    dists = {"weight": _q("normal", (H, D))}
    with pytest.warns(LocalReparameterizationWarning, match=r"'weight'.*ambiguous"):
        out, w = _traced(_plated, dists, local_reparameterization(), x, plate_size)
    torch.testing.assert_close(out, x @ w.T)  # the drawn weight, shared by everything
    with pytest.raises(NotImplementedError, match=r"'weight'.*strict=True"):
        _traced(_plated, dists, local_reparameterization(strict=True), x, plate_size)


def test_a_plate_over_the_examples_is_the_convention():
    """A data plate of the example axis's size agrees with the reading: no warning, and the
    two equal tokens of an example get the same output (one weight draw)."""
    x = _tokens()
    dists = {"weight": _q("normal", (H, D))}
    with warnings.catch_warnings():
        warnings.simplefilter("error", LocalReparameterizationWarning)
        out, w = _traced(_plated, dists, local_reparameterization(), x, K)
    torch.testing.assert_close(out[:, 0], out[:, 1])
    assert not torch.allclose(out, x @ w.T)  # sampled per example, not the drawn weight


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.integers(2, 4), max_size=2),
    examples=st.integers(1, 5),
    tokens=st.lists(st.integers(1, 4), max_size=2),
    vector=st.booleans(),
)
def test_token_layout_reads_sample_dims_examples_and_tokens(samples, examples, tokens, vector):
    """``(sample dims..., B, T..., d)`` with a weight drawn per sample (its batch laid out as
    ``samples + (1,) * (1 + len(T))``): the example axis is ``B``, the tokens are ``T``."""
    spec = LinearSpec(vector=vector)
    event = (3,) if vector else (2, 3)
    w = torch.zeros((*samples, *(1,) * (1 + len(tokens)), *event) if samples else event)
    x = torch.zeros((*samples, examples, *tokens, 3))
    assert token_layout(x, w, spec) == (examples, tuple(tokens))


def test_two_dimensional_inputs_keep_the_per_unit_lrt_path(monkeypatch):
    """``(B, d)`` and ``(S, B, d)`` inputs (a weight per sample): the rule sees a spec
    without token dims, i.e. the unchanged per-unit LRT path."""
    seen = []
    rule = registry._RULES[("lrt", torch.distributions.Normal)]

    def spy(fn, x, spec):
        seen.append(spec)
        return rule(fn, x, spec)

    monkeypatch.setitem(registry._RULES, ("lrt", torch.distributions.Normal), spy)
    layer, dists = _case("normal", "F.linear")
    for x, plate in (
        (torch.randn(5, D), contextlib.nullcontext()),
        (torch.randn(7, 5, D), pyro.plate("draws", 7, dim=-2)),
    ):
        with local_reparameterization(), plate:
            tr = poutine.trace(_guide(dists)).get_trace(x)
            poutine.replay(layer, trace=tr)(x)
    assert seen == [LinearSpec(), LinearSpec()]

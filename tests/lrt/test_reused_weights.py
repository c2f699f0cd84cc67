"""A weight used more than once in one run of the model under local reparameterisation.

Per-example noise at each use would give each use its own weights: a tied autoencoder's
encoder and decoder no longer share ``W``, a different model (issue 23 measured an expected
loss of 605.6 ± 2.9 inside the context against 348.7 ± 21.0 with weights as drawn). The rule:
such a site is sampled once per run and used as drawn at every use (exact for q), with one
warning per site; the library's guides announce reused sites from their set-up run, so even the
first run is exact; with another guide the handler finds the reuse at the second use and is
exact from the next run on.
"""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    fit,
    local_reparameterization,
    weight_draws,
)
from pyro_dropout.handlers import LocalReparameterizationWarning
from pyro_dropout.infer import MeanFieldELBO

from ._stats import Z

N, D, H = 32, 6, 3


def tied_autoencoder(x, y=None):
    """``h = x @ W; x̂ = h @ W.T``: one weight, two uses."""
    W = pyro.sample("W", dist.Normal(torch.zeros(D, H), 1.0).to_event(2))
    xhat = (x @ W) @ W.T
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(xhat, 0.5).to_event(1), obs=y)


def layer_twice(x, y=None):
    """A Linear layer (weight and bias) applied twice, then an untied read-out."""
    W = pyro.sample("W", dist.Normal(torch.zeros(D, D), 1.0).to_event(2))
    b = pyro.sample("b", dist.Normal(torch.zeros(D), 1.0).to_event(1))
    v = pyro.sample("v", dist.Normal(torch.zeros(D), 1.0).to_event(1))
    h = pyro.deterministic("h", torch.tanh(F.linear(torch.tanh(F.linear(x, W, b)), W, b)), 1)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(h @ v, 0.5), obs=y)


def _data(model):
    torch.manual_seed(0)
    x = torch.randn(N, D)
    y = x + 0.1 * torch.randn(N, D) if model is tied_autoencoder else torch.randn(N)
    return x, y


def _guide(cls, model, x, y, **kwargs):
    guide = cls(model, **kwargs)
    guide(x, y)
    torch.manual_seed(1)
    with torch.no_grad():  # posterior means away from the init, with real spread
        for name, p in guide.named_parameters():
            if "locs" in name:
                p.copy_(0.4 * torch.randn_like(p))
    return guide


def _losses(model, guide, x, y, seeds, lrt):
    elbo, out = MeanFieldELBO(), []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", LocalReparameterizationWarning)
        for seed in seeds:
            torch.manual_seed(seed)
            if lrt:
                with local_reparameterization():
                    out.append(float(elbo.differentiable_loss(model, guide, x, y)))
            else:
                out.append(float(elbo.differentiable_loss(model, guide, x, y)))
    return torch.tensor(out, dtype=torch.float64)


def _reuse_warnings(record):
    return [
        str(w.message)
        for w in record
        if issubclass(w.category, LocalReparameterizationWarning)
        and "more than one operation" in str(w.message)
    ]


#: Guides with a real spread (the defaults' is tiny, and so would be any difference).
WIDE = [
    (AutoDropout, {"dropout_rate": 0.5, "input_dropout_rate": 0.5}),
    (AutoMeanField, {"init_scale": 0.3}),
    (AutoVariationalDropout, {"init_log_alpha": 0.0}),
]


@pytest.mark.parametrize("cls, kwargs", WIDE, ids=[c.__name__ for c, _ in WIDE])
def test_expected_loss_inside_and_outside_the_context_agree(cls, kwargs):
    """The tied autoencoder, independent seeds inside and outside the context: the mean losses
    agree within Monte-Carlo error. With per-use noise (the behaviour before) the same test
    gives z = 14 for AutoDropout; for the Gaussian families the loss's heavy tails leave it
    weak (z 3 and 0.3), which the exact per-seed identity below covers."""
    model = tied_autoencoder
    x, y = _data(model)
    guide = _guide(cls, model, x, y, **kwargs)
    inside = _losses(model, guide, x, y, range(1000, 1200), lrt=True)
    outside = _losses(model, guide, x, y, range(5000, 5200), lrt=False)
    se = math.sqrt(inside.var() / len(inside) + outside.var() / len(outside))
    z = (inside.mean() - outside.mean()) / se
    assert abs(z) < Z, (inside.mean(), outside.mean(), se)


@pytest.mark.parametrize("cls, kwargs", WIDE, ids=[c.__name__ for c, _ in WIDE])
def test_the_drawn_weights_are_used_from_the_first_run_on(cls, kwargs):
    """With a library guide even the first run is exact: the reused sites are used as drawn,
    so with the same seed the tied model's loss, and the twice-applied layer's output (before
    its untied read-out ``v``, which still gets LRT), are exactly those of weight draws."""
    x, y = _data(tied_autoencoder)
    guide = _guide(cls, tied_autoencoder, x, y, **kwargs)
    for seed in (0, 1):
        inside = _losses(tied_autoencoder, guide, x, y, [seed], lrt=True)
        drawn = _losses(tied_autoencoder, guide, x, y, [seed], lrt=False)
        assert torch.equal(inside, drawn)
    pyro.clear_param_store()
    x, y = _data(layer_twice)
    guide = _guide(cls, layer_twice, x, y, **kwargs)
    for seed in (0, 1):
        outputs = []
        for lrt in (True, False):
            torch.manual_seed(seed)
            with local_reparameterization() if lrt else weight_draws(), torch.no_grad():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", LocalReparameterizationWarning)
                    tr = poutine.trace(guide).get_trace(x, y)
                    model_tr = poutine.trace(poutine.replay(layer_twice, trace=tr)).get_trace(x, y)
            outputs.append(model_tr.nodes["h"]["value"])
        assert torch.equal(*outputs)


def _run(model, guide, x, y):
    tr = poutine.trace(guide).get_trace(x, y)
    poutine.trace(poutine.replay(model, trace=tr)).get_trace(x, y)


def test_one_warning_per_reused_site_that_says_what_happens():
    x, y = _data(layer_twice)
    guide = _guide(AutoDropout, layer_twice, x, y, input_dropout_rate=0.5)
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization(), torch.no_grad():
            for _ in range(3):
                _run(layer_twice, guide, x, y)
    messages = _reuse_warnings(record)
    assert len(messages) == 2  # W and b; not v (used once), not once per run
    assert "'W'" in messages[0] and "'b'" in messages[1]
    for m in messages:
        assert "local reparameterisation is not applied to it" in m
        assert "sampled once per run (a weight draw from q)" in m and "exact for q" in m
        assert "found at the second use" not in m  # announced by the guide, not found late
    assert guide._infer("W") == {"weight_uses": 2} and guide._infer("v") == {}


def test_strict_raises_on_a_reused_site():
    x, y = _data(tied_autoencoder)
    guide = _guide(AutoMeanField, tied_autoencoder, x, y)
    with pytest.raises(NotImplementedError, match="'W' is used by more than one operation"):
        with local_reparameterization(strict=True), torch.no_grad():
            _run(tied_autoencoder, guide, x, y)


def _hand_written_guide(x, y=None):
    loc = pyro.param("W_loc", lambda: 0.4 * torch.randn(D, H))
    pyro.sample("W", dist.Normal(loc, 0.2).to_event(2))


def test_a_guide_that_does_not_announce_is_exact_from_the_run_after_the_second_use():
    """A hand-written guide says nothing: the handler finds the reuse at the second use of the
    first run (that run mixed the two, and the warning says so), then uses the site as drawn;
    the messenger's jit_key changes, so a compiled loss traced on the first run is retraced."""
    x, y = _data(tied_autoencoder)
    pyro.clear_param_store()
    elbo = MeanFieldELBO()
    msngr = local_reparameterization()
    with pytest.warns(LocalReparameterizationWarning) as record, torch.no_grad():
        with msngr:
            key = msngr.jit_key
            torch.manual_seed(3)
            first = elbo.differentiable_loss(tied_autoencoder, _hand_written_guide, x, y)
            assert msngr.jit_key != key
            torch.manual_seed(4)
            second = elbo.differentiable_loss(tied_autoencoder, _hand_written_guide, x, y)
    messages = _reuse_warnings(record)
    assert len(messages) == 1 and "found at the second use" in messages[0]
    with torch.no_grad():
        torch.manual_seed(4)
        drawn = elbo.differentiable_loss(tied_autoencoder, _hand_written_guide, x, y)
        torch.manual_seed(3)
        drawn_first = elbo.differentiable_loss(tied_autoencoder, _hand_written_guide, x, y)
    assert torch.equal(second, drawn)
    assert not torch.equal(first, drawn_first)
    # the same handler entered again remembers the site: exact from its first run
    with msngr, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", LocalReparameterizationWarning)
        torch.manual_seed(3)
        again = elbo.differentiable_loss(tied_autoencoder, _hand_written_guide, x, y)
    assert torch.equal(again, drawn_first)


def test_weight_draws_neither_warn_nor_change():
    x, y = _data(tied_autoencoder)
    guide = _guide(AutoDropout, tied_autoencoder, x, y, input_dropout_rate=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with weight_draws(), torch.no_grad():
            _run(tied_autoencoder, guide, x, y)


def test_compiled_fit_on_a_tied_model_warns_once_and_stays_compiled():
    """fit compiles the loss (JitMeanFieldELBO): the decision is made before the first trace
    (announced by the guide), so the graph is stable and the warning comes once."""
    x, y = _data(tied_autoencoder)
    guide = AutoDropout(tied_autoencoder, input_dropout_rate=0.1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(tied_autoencoder, guide, x, y, num_steps=4, jit=True, progress=False)
    messages = _reuse_warnings(record)
    assert len(messages) == 1 and "'W'" in messages[0]
    assert not [w for w in record if "ompil" in type(w.message).__name__]

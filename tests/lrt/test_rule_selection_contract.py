"""Which rule the messenger picks for a weight family, and what the user is told.

* ``"auto"``: LRT on Linear layers, Flipout on convolutions, one weight per example
  (``"per_example"``) for a family with neither, silently (it is exact).
* An estimator asked for by name that the family lacks falls back to ``"per_example"`` with
  a warning per site; a family without ``rsample`` gets no per-example rule: the weights are
  used as drawn, with the "no rule" warning per site.
* Each kind of warning comes once per site (two sites: two warnings).
* ``sample_gaussian_preactivation`` draws independent noise per output element even when the
  variance has more elements than the mean.
"""

import contextlib
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyro_dropout import local_reparameterization
from pyro_dropout.handlers import (
    LocalReparameterizationWarning,
    lookup_rule,
    register_local_reparameterization,
    registry,
)
from pyro_dropout.handlers.lrt_rules import sample_gaussian_preactivation

N = 64  # identical input rows: per-example noise makes them differ


class NoRsampleLaplace(dist.Laplace):
    """A weight family that cannot be reparameterised (no per-example rule applies)."""

    has_rsample = False


class SpyNormal(dist.Normal):
    """A Normal whose Flipout rule records its calls."""


def _two_layer(make_q, conv=False):
    """Model with two weight sites ``w1``, ``w2``; the guide emits ``make_q(shape)`` at each."""
    shapes = {"w1": (3, 2, 3), "w2": (2, 3, 3)} if conv else {"w1": (3, 2), "w2": (2, 3)}
    op = F.conv1d if conv else F.linear

    def model(x):
        h = x
        for name, shape in shapes.items():
            w = pyro.sample(name, dist.Normal(torch.zeros(shape), 1.0).to_event(len(shape)))
            h = op(h, w)
        return h

    def guide(x):
        g = torch.Generator().manual_seed(0)
        for name, shape in shapes.items():
            loc = torch.randn(shape, generator=g)
            pyro.sample(name, make_q(loc).to_event(len(shape)))

    x = torch.ones(N, 2, 5) if conv else torch.ones(N, 2)
    return model, guide, x


def _run(model, guide, x, **kwargs):
    with local_reparameterization(**kwargs), torch.no_grad():
        tr = poutine.trace(guide).get_trace(x)
        return poutine.replay(model, trace=tr)(x)


def _lrt_warnings(record):
    return [str(w.message) for w in record if w.category is LocalReparameterizationWarning]


@contextlib.contextmanager
def _no_lrt_warning():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        yield
    assert not _lrt_warnings(record), _lrt_warnings(record)


def test_auto_falls_back_to_one_weight_per_example_silently():
    model, guide, x = _two_layer(lambda loc: dist.Laplace(loc, 0.5))
    with _no_lrt_warning():
        out = _run(model, guide, x)
    assert out.shape == (N, 2)
    assert out.std(0).min() > 0  # identical rows differ: the weights were drawn per example


def test_an_estimator_the_family_lacks_falls_back_with_a_warning_per_site():
    model, guide, x = _two_layer(lambda loc: dist.Laplace(loc, 0.5))
    with pytest.warns(LocalReparameterizationWarning) as record:
        out = _run(model, guide, x, estimator="lrt")
    messages = _lrt_warnings(record)
    assert len(messages) == 2
    for name, message in zip(("w1", "w2"), messages, strict=True):
        assert f"no 'lrt' rule for the Laplace distribution at weight site {name!r}" in message
        assert "one weight draw per example ('per_example', exact)" in message
    assert out.std(0).min() > 0


def test_a_family_without_rsample_is_used_as_drawn_with_a_no_rule_warning_per_site():
    model, guide, x = _two_layer(lambda loc: NoRsampleLaplace(loc, 0.5))
    with pytest.warns(LocalReparameterizationWarning) as record:
        out = _run(model, guide, x)
    messages = _lrt_warnings(record)
    assert len(messages) == 2
    for name, message in zip(("w1", "w2"), messages, strict=True):
        assert repr(name) in message and "NoRsampleLaplace" in message
    assert out.std(0).max() == 0  # one weight draw shared by the minibatch


@pytest.fixture
def spy_flipout(monkeypatch):
    monkeypatch.setattr(registry, "_RULES", dict(registry._RULES))
    normal_flipout = lookup_rule(dist.Normal(0.0, 1.0), "flipout")
    calls = []

    @register_local_reparameterization(SpyNormal, estimator="flipout")
    def _spy(fn, x, spec):
        calls.append(type(spec).__name__)
        return normal_flipout(fn, x, spec)

    return calls


def test_auto_uses_flipout_on_convolutions_when_the_family_has_it(spy_flipout):
    model, guide, x = _two_layer(lambda loc: SpyNormal(loc, 0.5), conv=True)
    with _no_lrt_warning():
        out = _run(model, guide, x)
    assert len(spy_flipout) == 2 and out.shape == (N, 2, 1)
    model, guide, x = _two_layer(lambda loc: SpyNormal(loc, 0.5))
    _run(model, guide, x)  # Linear layers: LRT (the Normal's), not Flipout
    assert len(spy_flipout) == 2


def test_reuse_warnings_come_once_per_site():
    def model(x):
        h = x
        for name in ("w1", "w2"):
            w = pyro.sample(name, dist.Normal(torch.zeros(2, 2), 1.0).to_event(2))
            h = F.linear(F.linear(h, w), w)  # the same weight twice in one run
        return h

    def guide(x):
        for name in ("w1", "w2"):
            pyro.sample(name, dist.Normal(torch.zeros(2, 2), 0.5).to_event(2))

    x = torch.ones(4, 2)
    with pytest.warns(LocalReparameterizationWarning) as record:
        with local_reparameterization(), torch.no_grad():
            for _ in range(2):  # two model runs, one handler: still one warning per site
                tr = poutine.trace(guide).get_trace(x)
                poutine.replay(model, trace=tr)(x)
    messages = _lrt_warnings(record)
    assert len(messages) == 2
    assert "'w1' is used by more than one" in messages[0]
    assert "'w2' is used by more than one" in messages[1]


def test_gaussian_preactivation_noise_is_independent_per_element():
    torch.manual_seed(0)
    mean = torch.zeros(4000, 1)
    var = torch.ones(4000, 3)  # one mean per row, a variance per output
    out = sample_gaussian_preactivation(mean, var)
    assert out.shape == (4000, 3)
    corr = torch.corrcoef(out.T)
    off_diagonal = corr[~torch.eye(3, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 0.1  # 6 standard errors of a zero correlation

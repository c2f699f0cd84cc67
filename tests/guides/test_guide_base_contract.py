"""Behaviour of the shared guide machinery (guides/base.py) that every family relies on:
parameter names per instance, which supports count as real, models called without tensors,
initial values cast to the site's dtype, and constrained sites inside plates."""

import copy
import itertools

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints

from pyro_dropout import AutoDropout, AutoMeanField, AutoVariationalDropout
from pyro_dropout.distributions import BernoulliMaskedNormal


class AutoDropoutOnInputs(AutoDropout):
    """AutoDropout that drops the inputs of these one-layer models too (by default it keeps
    them, and warns that it then drops nothing)."""

    def __init__(self, model, **kwargs):
        kwargs.setdefault("input_dropout_rate", 0.1)
        super().__init__(model, **kwargs)


GUIDES = [AutoDropoutOnInputs, AutoMeanField, AutoVariationalDropout]
_FRESH = itertools.count()


def _fresh_subclass(cls):
    """A subclass with a name no other test used (its param-store prefix is its own)."""
    return type(f"{cls.__name__}Fresh{next(_FRESH)}", (cls,), {})


def _weight_model(x=None, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
    if x is None:
        return w
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("obs", dist.Normal(x @ w.T, 1.0).to_event(1), obs=y)


@pytest.mark.parametrize("cls", GUIDES)
def test_instances_are_named_after_their_class_however_many_a_session_built(cls):
    """The store prefix does not count instances (a saved param store must load in a new
    process); name= replaces it."""
    pyro.clear_param_store()
    sub = _fresh_subclass(cls)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    for _ in range(3):  # each one gone before the next sets up: a notebook cell run thrice
        guide = sub(_weight_model)
        guide(x, y)
        assert guide._pyro_name == sub.__name__
    named = sub(_weight_model, name="mine")
    named(x, y)
    assert named._pyro_name == "mine"
    assert {"mine.locs.w", f"{sub.__name__}.locs.w"} <= set(pyro.get_param_store().keys())


@pytest.mark.parametrize("cls", GUIDES)
def test_a_second_live_guide_of_a_class_takes_a_numbered_prefix_and_warns(cls):
    pyro.clear_param_store()
    sub = _fresh_subclass(cls)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    first, second = sub(_weight_model), sub(_weight_model)
    first(x, y)
    with pytest.warns(UserWarning, match=f"uses '{sub.__name__}_1'.*name="):
        second(x, y)
    keys = set(pyro.get_param_store().keys())
    assert f"{sub.__name__}.locs.w" in keys
    assert f"{sub.__name__}_1.locs.w" in keys
    assert first.locs.w_unconstrained is not second.locs.w_unconstrained


class _RealCopySupport(dist.Normal):
    """A Normal whose support is an equal but distinct instance of ``constraints.real`` (as a
    deep copy or an unpickled distribution carries)."""

    support = copy.deepcopy(constraints.real)


def test_a_copied_real_support_is_treated_as_real():
    assert _RealCopySupport.support is not constraints.real

    def model(x, y):
        w = pyro.sample("w", _RealCopySupport(0.0, 1.0).expand([2, 3]).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w.T, 1.0).to_event(1), obs=y)

    pyro.clear_param_store()
    guide = AutoDropout(model, dropout_rate=0.2, input_dropout_rate=0.2)
    guide(torch.randn(4, 3), torch.randn(4, 2))
    q = guide.get_distributions()["w"]
    while not isinstance(q, BernoulliMaskedNormal):  # the family, not a bijected Normal
        q = q.base_dist


@pytest.mark.parametrize("cls", GUIDES)
def test_a_model_called_without_arguments(cls):
    # Data captured by the model (a closure) is a way users write models: no tensor argument
    # to take a device from.
    x, y = torch.randn(5, 3), torch.randn(5, 2)

    def model():
        return _weight_model(x, y)

    pyro.clear_param_store()
    guide = cls(model)
    sample = guide()
    assert sample["w"].shape == (2, 3)


@pytest.mark.parametrize("cls", GUIDES)
def test_values_of_a_custom_init_fn_are_cast_to_the_sites_dtype(cls):
    def model(x, y):
        w = pyro.sample(
            "w", dist.Normal(torch.zeros((), dtype=torch.float64), 1.0).expand([2, 3]).to_event(2)
        )
        s = pyro.sample("s", dist.LogNormal(torch.zeros((), dtype=torch.float64), 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w.T, s).to_event(1), obs=y)

    def init_float32(site):  # e.g. a user's init function written for float32 networks
        return torch.full(site["fn"].shape(), 0.5, dtype=torch.float32)

    pyro.clear_param_store()
    guide = cls(model, init_loc_fn=init_float32)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    sample = guide(x, y)
    assert {v.dtype for v in sample.values()} == {torch.float64}
    assert {p.dtype for p in guide.parameters()} == {torch.float64}


@pytest.mark.parametrize("cls", GUIDES)
def test_constrained_site_in_a_plate_keeps_its_batch_shape(cls):
    # A positive noise scale per member, as in the UCI benchmark's "members" plate: the
    # guide's distribution has the plate's batch shape, not an event dim per member.
    def model(x, y):
        with pyro.plate("members", 3, dim=-1):
            s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], dim=-2):
            pyro.sample("obs", dist.Normal(0.0, s), obs=y)

    pyro.clear_param_store()
    guide = cls(model)
    guide(torch.randn(4, 1), torch.randn(4, 3))
    q = guide.get_distributions()["s"]
    assert q.batch_shape == (3,) and q.event_shape == ()
    assert guide()["s"].shape == (3,)

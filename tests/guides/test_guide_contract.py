"""Contracts of the weight guides that the other tests leave open: keyword arguments,
create_plates, dtypes and devices of the emitted families, defaults, argument checks, recovery
from a failed set-up, and init_to_module's matching and dtype."""

import json

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_dropout import AutoConcreteDropout, AutoDropout, AutoMeanField, AutoVariationalDropout
from pyro_dropout.guides import LOG_ALPHA_CLIP, init_to_module


def _model(x, y=None, extra=False):
    """A weight ``w`` (2, 3), a bias ``b`` (2,) and, with ``extra``, a second weight ``v``."""
    zero = x.new_zeros(())
    w = pyro.sample("w", dist.Normal(zero, 1.0).expand([2, 3]).to_event(2))
    b = pyro.sample("b", dist.Normal(zero, 1.0).expand([2]).to_event(1))
    if extra:
        pyro.sample("v", dist.Normal(zero, 1.0).expand([2, 2]).to_event(2))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal((x @ w.T + b).sum(-1), 1.0), obs=y)


def _data(dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, generator=g, dtype=dtype)
    return x.to(device), x.sum(-1).to(device)


GUIDES = {
    "dropout": lambda m, **kw: AutoDropout(m, input_dropout_rate=0.1, **kw),
    "dropout_rates": lambda m, **kw: AutoDropout(
        m,
        dropout_rate=torch.tensor([[0.1, 0.2, 0.3]]),
        input_dropout_rate=torch.tensor([[0.1, 0.2, 0.3]]),
        **kw,
    ),
    "dropout_learn_scale": lambda m, **kw: AutoDropout(
        m, learn_scale=True, input_dropout_rate=0.1, **kw
    ),
    "mean_field": lambda m, **kw: AutoMeanField(m, **kw),
    "vd_weight": lambda m, **kw: AutoVariationalDropout(m, alpha="weight", **kw),
    "vd_unit": lambda m, **kw: AutoVariationalDropout(m, alpha="unit", **kw),
    "vd_layer": lambda m, **kw: AutoVariationalDropout(m, alpha="layer", **kw),
    "concrete_layer": lambda m, **kw: AutoConcreteDropout(m, **kw),
    "concrete_unit": lambda m, **kw: AutoConcreteDropout(m, rate_per="unit", **kw),
}
#: One configuration per guide class, for the behaviour that does not depend on the family.
CLASSES = ["dropout", "mean_field", "vd_weight", "concrete_layer"]


def _fns(guide, *args, **kwargs):
    trace = poutine.trace(guide).get_trace(*args, **kwargs)
    return {n: s["fn"] for n, s in trace.nodes.items() if s["type"] == "sample"}


def _tensors(fn):
    """Every tensor attribute of a distribution and of the distributions it wraps."""
    out = []
    while fn is not None:
        out += [v for v in vars(fn).values() if torch.is_tensor(v)]
        fn = getattr(fn, "base_dist", None)
    return out


# --------------------------------------------------------------------------------------------
# arguments passed by keyword, create_plates
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CLASSES)
def test_model_arguments_may_be_passed_by_keyword(name):
    """guide(x=x, y=y) and median(x=x, y=y) set the guide up like positional arguments."""
    x, y = _data()
    guide = GUIDES[name](_model)
    assert set(guide(x=x, y=y)) == {"w", "b"}
    fresh = GUIDES[name](_model, name="fresh")  # a second live guide of the class
    assert set(fresh.median(x=x, y=y)) == {"w", "b"}


@pytest.mark.parametrize("name", CLASSES)
def test_create_plates_is_called_with_the_model_arguments(name):
    calls = []

    def create_plates(x, y=None):
        calls.append((x, y))
        return pyro.plate("data", x.shape[0])

    x, y = _data()
    guide = GUIDES[name](_model, create_plates=create_plates)
    guide(x, y)
    guide(x, y)
    guide(x, y=y)  # keyword arguments reach create_plates too
    assert len(calls) == 3
    assert calls[0][0] is x and calls[0][1] is y
    assert calls[2][0] is x and calls[2][1] is y


# --------------------------------------------------------------------------------------------
# dtype and device of the parameters and of the emitted distributions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GUIDES)
def test_float64_model_gets_float64_parameters_and_families(name):
    x, y = _data(torch.float64)
    guide = GUIDES[name](_model)
    fns = _fns(guide, x, y)
    for key, value in pyro.get_param_store().items():
        assert value.dtype == torch.float64, key
    for site in ("w", "b"):
        for t in _tensors(fns[site]):
            assert t.dtype == torch.float64, site


def test_float64_dropout_rate_and_slab_scale_are_exact():
    """The fixed rate and slab sd reach a float64 model without a float32 round trip."""
    x, y = _data(torch.float64)
    fns = _fns(AutoDropout(_model, dropout_rate=0.1, input_dropout_rate=0.1, scale=0.01), x, y)
    assert (fns["w"].dropout_rate == 0.1).all()
    assert (fns["w"].scale == 0.01).all()
    assert (fns["b"].base_dist.scale == 0.01).all()


@pytest.mark.parametrize("name", GUIDES)
def test_parameters_and_families_follow_the_data_device(name):
    """Set up on data of another device (meta), everything the guide holds or emits is there."""
    x, y = _data(device="meta")
    guide = GUIDES[name](_model)
    with pyro.validation_enabled(False):  # meta tensors hold no values to check
        fns = _fns(guide, x, y)
    for key, value in pyro.get_param_store().items():
        assert value.device.type == "meta", key
    for site in ("w", "b"):
        for t in _tensors(fns[site]):
            assert t.device.type == "meta", site


# --------------------------------------------------------------------------------------------
# defaults, configs and argument checks
# --------------------------------------------------------------------------------------------


def test_default_scales_and_their_descriptions():
    """Default slab sd and initial sd are 0.01; configs are JSON with sorted keys."""
    dropout = AutoDropout(_model)
    assert dropout.describe() == {
        "family": "mc_dropout",
        "config": '{"dropout_rate": 0.1, "input_dropout_rate": 0.0, "learn_scale": false, "scale": 0.01}',
    }
    mapping = AutoDropout(_model, dropout_rate={"w": 0.2}, scale=0.5, learn_scale=True)
    config = mapping.describe()["config"]
    assert config == json.dumps(json.loads(config), sort_keys=True)
    assert list(json.loads(config)) == ["dropout_rate", "learn_scale", "scale"]
    assert AutoMeanField(_model).describe()["config"] == '{"init_scale": 0.01}'
    x, y = _data()
    fns = _fns(AutoMeanField(_model), x, y)
    torch.testing.assert_close(fns["w"].base_dist.scale, torch.full((2, 3), 0.01))


def test_a_one_element_tensor_rate_is_the_scalar_rate():
    rate = torch.tensor([0.25], dtype=torch.float64)
    guide = AutoDropout(_model, dropout_rate=rate, input_dropout_rate=rate)
    assert guide.dropout_rate == 0.25 and isinstance(guide.dropout_rate, float)
    assert guide.input_dropout_rate == 0.25 and isinstance(guide.input_dropout_rate, float)
    assert json.loads(guide.describe()["config"])["dropout_rate"] == 0.25
    x, y = _data()
    fn = _fns(guide, x, y)["w"]
    assert fn.loc.dtype == torch.float32
    assert fn.dropout_rate.shape == (1, 3)
    torch.testing.assert_close(fn.dropout_rate, torch.full((1, 3), 0.25))


def test_a_tensor_of_rates_may_contain_zero():
    """p = 0 (keep every unit) is a valid drop probability in a tensor of rates too."""
    rates = torch.tensor([[0.0, 0.5, 0.2]])
    x, y = _data()
    fn = _fns(AutoDropout(_model, input_dropout_rate=rates), x, y)["w"]
    torch.testing.assert_close(fn.dropout_rate, rates)


@pytest.mark.parametrize("rate", [None, [0.1], object()])
def test_a_rate_that_is_not_a_number_raises(rate):
    with pytest.raises(ValueError, match="drop probability"):
        AutoDropout(_model, dropout_rate=rate)
    with pytest.raises(ValueError, match=r"dropout_rate\['w'\]"):
        AutoDropout(_model, dropout_rate={"w": rate})


@pytest.mark.parametrize("log_alpha", LOG_ALPHA_CLIP)
def test_init_log_alpha_range_includes_its_ends(log_alpha):
    x, y = _data()
    guide = AutoVariationalDropout(_model, alpha="layer", init_log_alpha=log_alpha)
    guide(x, y)
    torch.testing.assert_close(guide.log_alpha("w"), torch.full((2, 3), log_alpha))


def test_weight_log_alpha_is_finite_at_a_zero_mean():
    """θ = 0 exactly: log α = log σ² − log(tiny) stays finite and the variance is σ²."""
    x, y = _data()
    guide = AutoVariationalDropout(
        _model, alpha="weight", init_loc_fn=lambda site: torch.zeros(site["fn"].shape())
    )
    fn = _fns(guide, x, y)["w"].base_dist
    log_sigma2 = pyro.get_param_store()[f"{guide._pyro_name}.log_sigma2.w"]
    log_alpha = guide.log_alpha("w")
    assert torch.isfinite(log_alpha).all()
    torch.testing.assert_close(log_alpha, log_sigma2 - torch.log(torch.tensor(torch.finfo().tiny)))
    torch.testing.assert_close(fn.variance, log_sigma2.exp())


# --------------------------------------------------------------------------------------------
# a failed set-up, get_distributions
# --------------------------------------------------------------------------------------------


def test_a_failed_set_up_leaves_nothing_behind_and_the_next_call_starts_afresh():
    x, y = _data()
    guide = AutoDropout(_model, dropout_rate={"w": 0.1})
    with pytest.raises(ValueError, match=r"missing: \['v'\]"):
        guide(x, y, extra=True)  # a site the mapping does not name
    assert list(guide.named_parameters()) == []
    assert set(guide(x, y)) == {"w", "b"}
    assert sorted(n for n, _ in guide.named_parameters()) == [
        "locs.b_unconstrained",
        "locs.w_unconstrained",
    ]


@pytest.mark.parametrize("name", CLASSES)
def test_get_distributions_includes_constrained_sites(name):
    def model(x, y=None):
        _model(x, y)
        sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data2", x.shape[0]):
            pyro.sample("obs2", dist.Normal(x[:, 0], sigma), obs=y)

    x, y = _data()
    guide = GUIDES[name](model)
    guide(x, y)
    dists = guide.get_distributions()
    assert set(dists) == {"w", "b", "sigma"}
    assert (dists["sigma"].sample((100,)) > 0).all()
    assert torch.isfinite(dists["sigma"].log_prob(torch.tensor(1.0)))


# --------------------------------------------------------------------------------------------
# init_to_module
# --------------------------------------------------------------------------------------------


class _TwoMatches(torch.nn.Module):
    """Parameters "weight" and "0.weight": both are suffixes of the site "net.0.weight"."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((2, 3), -1.0))
        self.add_module("0", torch.nn.Linear(3, 2))


def _site(name, shape):
    return {"name": name, "fn": dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape))}


def test_init_to_module_takes_the_longest_matching_parameter_name():
    module = _TwoMatches()
    value = init_to_module(module)(_site("net.0.weight", (2, 3)))
    torch.testing.assert_close(value, getattr(module, "0").weight.detach())


def test_init_to_module_returns_the_sites_dtype():
    """A float32 site gets the float64 network's weights in float32; a float64 site gets them
    exactly (no float32 round trip)."""
    module = torch.nn.Linear(3, 2).double()
    module.weight.data += 1e-9  # below float32 resolution at this scale
    value = init_to_module(module)(_site("net.weight", (2, 3)))
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, module.weight.detach().float())
    site64 = {
        "name": "net.weight",
        "fn": dist.Normal(torch.zeros((), dtype=torch.float64), 1.0).expand((2, 3)).to_event(2),
    }
    value64 = init_to_module(module)(site64)
    assert value64.dtype == torch.float64
    assert torch.equal(value64, module.weight.detach())

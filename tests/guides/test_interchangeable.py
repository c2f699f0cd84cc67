"""One model, three guides: the model object is fitted with every guide without being touched,
and each guide emits its variational family at the model's own weight sites."""

import copy

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import Normal
from torch.distributions import Independent

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    BernoulliMaskedNormal,
    fit,
    predict,
)

WEIGHTS = ("net.layers.0.weight", "net.layers.1.weight")
BIASES = ("net.layers.0.bias", "net.layers.1.bias")


def _data(n=32):
    torch.manual_seed(0)
    x = torch.randn(n, 3)
    y = x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(n)
    return x, y


def _guide_sites(guide, *args):
    trace = poutine.trace(guide).get_trace(*args)
    return {n: s for n, s in trace.nodes.items() if s["type"] == "sample"}


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_one_model_object_is_fitted_with_each_guide_without_being_touched():
    """The learned noise is a latent site (``likelihood.noise_scale``) that each guide infers
    with its own parameters: the model has no parameters a fit could change."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=None, prior=1.0)
    model(x, y)
    structure = repr(model)
    modules = [(name, type(m)) for name, m in model.named_modules()]
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    assert _state(model) == {} and list(model.parameters()) == []

    guides = [
        AutoDropout(model, dropout_rate=0.1),
        AutoMeanField(model),
        AutoVariationalDropout(model),
    ]
    snapshots = {}
    for guide in guides:
        losses = fit(model, guide, x, y, num_steps=25, lr=0.02, progress=False, seed=0)
        assert len(losses) == 25 and all(map(torch.isfinite, torch.tensor(losses)))
        assert "likelihood.noise_scale" in guide.median()  # the guide's own noise
        snapshots[type(guide).__name__] = {k: v.clone() for k, v in guide.median().items()}

    assert repr(model) == structure
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    assert set(dict(model.named_buffers())) == set(buffers)
    assert _state(model) == {} and list(model.parameters()) == []

    # Each guide kept its own parameters: fitting the later guides did not move earlier ones.
    for guide in guides:
        for name, value in guide.median().items():
            torch.testing.assert_close(value, snapshots[type(guide).__name__][name])
    # and each still predicts with the shared model
    for guide in guides:
        assert predict(model, guide, x, num_samples=4, seed=0).samples.shape == (4, 32, 1)


def test_guides_own_disjoint_param_store_entries():
    """Every guide instance has its own prefix in Pyro's global param store, also two of one
    class: the second does not start from (and then move) the first one's parameters."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guides = [
        AutoDropout(model),
        AutoMeanField(model),
        AutoVariationalDropout(model),
        AutoMeanField(model, init_scale=0.5),
    ]
    fit(model, guides[1], x, y, num_steps=30, lr=0.05, progress=False, seed=0)
    # the fitted AutoMeanField is live: the second one sets up under another prefix, and says so
    with pytest.warns(UserWarning, match="uses 'AutoMeanField_1'"):
        for guide in guides:
            guide(x, y)
    prefixes = [g._pyro_name for g in guides]
    assert len(set(prefixes)) == 4
    names = set(pyro.get_param_store())
    by_guide = {p: {n for n in names if n.startswith(p + ".")} for p in prefixes}
    assert all(by_guide.values())
    assert set().union(*by_guide.values()) == names  # fixed tau: the model has no params
    scale = guides[3].get_distributions()["net.layers.0.weight"].base_dist.scale
    torch.testing.assert_close(scale, torch.full_like(scale, 0.5))  # fresh, not the fit's


# --------------------------------------------------------------------------------------------
# the family at each site
# --------------------------------------------------------------------------------------------


def test_dropout_guide_emits_bernoulli_masked_normal_at_weights_and_normal_at_biases():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoDropout(model, dropout_rate=0.25, input_dropout_rate=0.25, scale=0.03)
    sites = _guide_sites(guide, x, y)
    assert set(sites) == set(WEIGHTS + BIASES)
    for name in WEIGHTS:
        fn = sites[name]["fn"]
        assert type(fn) is BernoulliMaskedNormal
        assert fn.batch_shape == () and fn.event_shape == sites[name]["value"].shape
        torch.testing.assert_close(fn.dropout_rate, torch.full(fn.mask_shape, 0.25))
        torch.testing.assert_close(fn.scale, torch.full(fn.event_shape, 0.03))
    for name in BIASES:
        fn = sites[name]["fn"]
        assert isinstance(fn, Independent) and type(fn.base_dist) is Normal
        assert fn.event_shape == sites[name]["value"].shape
        torch.testing.assert_close(fn.base_dist.scale, torch.full(fn.event_shape, 0.03))
    assert guide.describe()["family"] == "mc_dropout"


@pytest.mark.parametrize("cls", [AutoMeanField, AutoVariationalDropout])
def test_gaussian_guides_emit_independent_normal_at_every_site(cls):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = cls(model)
    sites = _guide_sites(guide, x, y)
    assert set(sites) == set(WEIGHTS + BIASES)
    for name, site in sites.items():
        fn = site["fn"]
        assert isinstance(fn, Independent) and isinstance(fn.base_dist, Normal), name
        assert fn.batch_shape == () and fn.event_shape == site["value"].shape
    dists = guide.get_distributions()
    assert set(dists) == set(sites)
    assert all(isinstance(d, Independent) for d in dists.values())


def test_mean_field_initial_scale():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoMeanField(model, init_scale=0.07)
    for site in _guide_sites(guide, x, y).values():
        torch.testing.assert_close(site["fn"].base_dist.scale, torch.full_like(site["value"], 0.07))
    assert guide.describe() == {"family": "mean_field", "config": '{"init_scale": 0.07}'}


def test_variational_dropout_initial_alpha_sets_the_scale():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoVariationalDropout(model, init_log_alpha=-4.0, init_scale=0.02)
    sites = _guide_sites(guide, x, y)
    for name in WEIGHTS:
        base = sites[name]["fn"].base_dist
        alpha = base.scale**2 / base.loc**2
        torch.testing.assert_close(alpha.log(), torch.full_like(alpha, -4.0), atol=1e-3, rtol=0)
    for name in BIASES:
        torch.testing.assert_close(
            sites[name]["fn"].base_dist.scale, torch.full_like(sites[name]["value"], 0.02)
        )
    assert guide.describe()["family"] == "variational_dropout"


def test_non_real_sites_get_a_transformed_normal():
    """A latent with constrained support (a LogNormal noise scale) is handled by every guide."""

    def model(x, y=None):
        base = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
        f = base.net(x)
        sigma = pyro.sample("sigma", pyro.distributions.LogNormal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", pyro.distributions.Normal(f.squeeze(-1), sigma), obs=y)
        return f

    x, y = _data()
    for cls in (AutoDropout, AutoMeanField, AutoVariationalDropout):
        pyro.clear_param_store()
        guide = cls(model)
        sites = _guide_sites(guide, x, y)
        assert sites["sigma"]["value"] > 0
        assert guide.median()["sigma"] == pytest.approx(1.0)  # init_to_feasible: exp(0)
        fit(model, guide, x, y, num_steps=3, progress=False, seed=0)


def test_median_requires_the_model_arguments_before_the_first_call():
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    guide = AutoMeanField(model)
    with pytest.raises(RuntimeError, match="has not seen the model yet"):
        guide.median()
    x, y = _data()
    assert set(guide.median(x, y)) == set(WEIGHTS + BIASES)


def test_local_latents_in_a_subsampled_plate_are_rejected():
    def model(x, y=None, num_data=None):
        with pyro.plate("data", num_data, subsample_size=x.shape[0]):
            z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0))
            pyro.sample("obs", pyro.distributions.Normal(z, 1.0), obs=y)

    x, y = _data()
    with pytest.raises(
        NotImplementedError, match="local latent variable .*Sample the weights outside the plate"
    ):
        AutoMeanField(model)(x, y, num_data=100)


def test_median_returns_detached_copies():
    """``median()`` returns detached copies, not views on the parameters."""
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    guide = AutoMeanField(model)
    med = guide.median(x, y)
    snapshot = copy.deepcopy(med)
    fit(model, guide, x, y, num_steps=5, lr=0.1, progress=False, seed=0)
    for name in med:
        assert torch.equal(med[name], snapshot[name])

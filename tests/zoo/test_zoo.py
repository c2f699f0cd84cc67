"""The zoo of user models (``_models.py``) × the three guides × every entry point: SVI with and
without local reparameterisation, ``Predictive`` sequential and parallel, ``predict``,
``to_inference_data`` and ``compare``.

Where a model as written cannot broadcast over a leading sample dimension (the tutorial
network sizes its plate from a reassigned ``x``; the CNNs max-pool 4-D tensors), Pyro's
``Predictive(parallel=True)`` fails in the model's own code and ``predict`` falls back to one
draw per pass, with one ``VectorizationWarning`` per call naming the exception (never
silent); ``predict(vectorize=True)`` raises and says why.
"""

import contextlib
import warnings

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import Predictive

from pyro_dropout import (
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    compare,
    fit,
    local_reparameterization,
    predict,
    to_inference_data,
    weight_draws,
)
from pyro_dropout.diagnostics import loo
from pyro_dropout.handlers import LocalReparameterizationWarning
from pyro_dropout.infer import CompilationWarning
from pyro_dropout.infer.draws import NotVectorizable, VectorizationWarning

from ._models import ZOO

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.2),
    "mean_field": lambda m: AutoMeanField(m),
    "variational_dropout": lambda m: AutoVariationalDropout(m),
}
#: models whose own code does not broadcast over a leading sample dimension
NOT_VECTORIZABLE = {"tutorial", "pyro_cnn", "bayesianized_cnn"}
N, N_TEST, T = 40, 30, 6


@contextlib.contextmanager
def _fallback(name, count=1):
    """A model of ``NOT_VECTORIZABLE`` is drawn one draw per pass, with ``count`` warnings
    (one per model per call); any other model vectorises without one."""
    if name not in NOT_VECTORIZABLE:
        yield
        return
    with pytest.warns(VectorizationWarning, match="does not broadcast over a leading draw") as w:
        yield
    assert len([r for r in w if issubclass(r.category, VectorizationWarning)]) == count


def _fitted(name, guide_name, lrt=True, steps=4):
    build, data, task = ZOO[name]
    model = build()
    x, y = data(N, 0)
    guide = GUIDES[guide_name](model)
    # a model that subsamples its own plate cannot be compiled (fit's default): one warning
    compiles = pytest.warns(CompilationWarning, match="subsamples its own plate")
    with compiles if name == "subsampled" else warnings.catch_warnings():
        # every weight of every zoo model meets a rule: no warning may be raised
        warnings.simplefilter("error", LocalReparameterizationWarning)
        losses = fit(
            model, guide, x, y, num_steps=steps, lr=0.01, local_reparameterization=lrt,
            progress=False, seed=0,
        )  # fmt: skip
    assert len(losses) == steps and np.isfinite(losses).all()
    return model, guide, x, y, task


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_svi_with_and_without_lrt(name, guide_name):
    _fitted(name, guide_name, lrt=True)
    _fitted(name, guide_name, lrt=False)


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_predictive_sequential_and_parallel(name, guide_name):
    model, guide, x, _, _ = _fitted(name, guide_name)
    rows = 16 if name == "subsampled" else N_TEST  # Pyro's Predictive keeps the subsample
    for handler in (local_reparameterization, weight_draws):
        out = handler(Predictive(model, guide=guide, num_samples=T, return_sites=["obs"]))(
            x[:N_TEST]
        )
        assert out["obs"].shape == (T, rows)
        parallel = handler(
            Predictive(model, guide=guide, num_samples=T, parallel=True, return_sites=["obs"])
        )
        if name in NOT_VECTORIZABLE:
            with pytest.raises((RuntimeError, ValueError)):
                parallel(x[:N_TEST])
        else:
            assert parallel(x[:N_TEST])["obs"].shape == (T, rows)


@pytest.mark.parametrize("guide_name", sorted(GUIDES))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_predict_every_row(name, guide_name):
    model, guide, x, y, task = _fitted(name, guide_name)
    for lrt in (True, False):
        with _fallback(name):
            pred = predict(model, guide, x[:N_TEST], num_samples=T, local_reparameterization=lrt)
        assert pred.samples.shape[:2] == (T, N_TEST)  # every row, also through a subsample plate
        assert pred.kind == task
        ll = pred.log_likelihood(y[:N_TEST])
        assert ll.shape == (N_TEST,) and torch.isfinite(ll).all()
        if task == "classification":
            assert pred.probs.shape == (N_TEST, 3)
            torch.testing.assert_close(pred.probs.sum(-1), torch.ones(N_TEST))
        else:
            assert pred.mean.shape == (N_TEST,) and (pred.variance > 0).all()
    if name in NOT_VECTORIZABLE:
        with pytest.raises(NotVectorizable, match="does not broadcast"):
            predict(model, guide, x[:N_TEST], num_samples=T, vectorize=True)
    else:
        predict(model, guide, x[:N_TEST], num_samples=T, vectorize=True)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_export_and_compare_the_three_guides(name):
    fits = {g: _fitted(name, g)[:2] for g in sorted(GUIDES)}
    _, data, task = ZOO[name]
    x, y = data(N, 0)
    x_test, y_test = data(N_TEST, 1)
    data_kwargs = dict(x=x, y=y, x_test=x_test, y_test=y_test)
    with _fallback(name):
        idata = to_inference_data(*fits["mean_field"], num_samples=40, seed=0, **data_kwargs)
    assert np.isfinite(loo(idata).elpd)  # ArviZ's az.loo on the installed line
    with _fallback(name, count=len(GUIDES)):  # three fits: three models, one warning each
        table = compare(fits, num_samples=40, **data_kwargs)
    assert sorted(table.index) == sorted(GUIDES)
    assert np.isfinite(table["elpd_loo"]).all() and np.isfinite(table["test_lpd"]).all()
    if task == "classification":
        assert table["test_accuracy"].between(0, 1).all()


def test_subsampled_model_predicts_all_rows_in_order():
    """100 test points through a plate that subsamples 16: all 100, in order. With a
    near-deterministic guide every draw equals the network on the plain rows."""
    from ._models import SubsampledRegression

    model = SubsampledRegression()
    x, y = ZOO["subsampled"][1](100, 0)
    guide = AutoMeanField(model, init_scale=1e-6)
    fit(model, guide, x, y, num_steps=30, lr=0.05, progress=False, seed=0, jit=False)
    pred = predict(model, guide, x, num_samples=3)
    med = guide.median()
    h = torch.tanh(x @ med["l1.weight"].T + med["l1.bias"])
    expected = (h @ med["l2.weight"].T + med["l2.bias"]).squeeze(-1)
    assert pred.samples.shape == (3, 100)
    torch.testing.assert_close(pred.samples, expected.expand(3, 100), atol=1e-3, rtol=0)


def test_tutorial_model_float64_numpy_inputs():
    """numpy float64 arrays (scikit-learn's default) are cast to the model's dtype."""
    build, data, _ = ZOO["tutorial"]
    model = build()
    x, y = data(N, 0)
    guide = AutoMeanField(model)
    fit(model, guide, x.double().numpy(), y.double().numpy(), num_steps=3, progress=False)
    with _fallback("tutorial"):
        pred = predict(model, guide, x.double().numpy(), num_samples=T)
    assert pred.samples.dtype == torch.float32
    assert torch.isfinite(pred.log_likelihood(y.double().numpy())).all()


@pytest.fixture(autouse=True)
def _seed():
    pyro.set_rng_seed(0)

"""The misuse suite (issue 23): every public entry point refuses a wrong argument with the
library's own error, of a stated type, whose message names the argument; and properties over
the shapes and dtypes of ``x``, ``y`` and ``num_data``: no raw torch or Pyro error escapes,
and a target that differs by a trailing axis of size 1 gives identical numbers.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyro.infer import Predictive
from pyro.nn import PyroModule, PyroSample
from torch.utils.data import DataLoader, TensorDataset

import pyro_dropout as pd
from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianMLP,
    bayesianize,
    fit,
    local_reparameterization,
    predict,
)

N, D = 40, 3


def _data(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    y = x.sum(-1) + 0.1 * torch.randn(n, generator=g)
    return x, y


def _mlp(hidden=8):
    return BayesianMLP(D, 1, hidden=(hidden,), tau=10.0)


def _fitted(seed=0):
    pyro.set_rng_seed(seed)
    x, y = _data(seed)
    model = _mlp()
    guide = AutoDropout(model, dropout_rate=0.1)
    fit(model, guide, x, y, num_steps=2, progress=False, jit=False)
    return model, guide


class Tutorial(PyroModule):
    """Pyro's tutorial regression: a (N,) observed site (``mu.squeeze(-1)``)."""

    def __init__(self, d=D, h=6):
        super().__init__()
        self.l1 = PyroModule[nn.Linear](d, h)
        self.l2 = PyroModule[nn.Linear](h, 1)
        self.l1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
        self.l1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([h]).to_event(1))
        self.l2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, h]).to_event(2))
        self.l2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        mu = self.l2(torch.tanh(self.l1(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, 0.5), obs=y)
        return mu


class InPlate(PyroModule):
    """A PyroModule[nn.Linear] called inside a subsampled plate (its weights become local)."""

    def __init__(self):
        super().__init__()
        self.lin = PyroModule[nn.Linear](D, 1)
        self.lin.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, D]).to_event(2))
        self.lin.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        with pyro.plate("data", x.shape[0], subsample_size=10) as idx:
            mu = self.lin(x[idx]).squeeze(-1)
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=None if y is None else y[idx])


def logreg(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[-1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("obs", dist.Bernoulli(logits=x @ w), obs=y)


def softmax_reg(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, x.shape[-1]), 1.0).to_event(2))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("obs", dist.Categorical(logits=x @ w.T), obs=y)


def tied(x, y=None):
    w = pyro.sample("W", dist.Normal(torch.zeros(4, x.shape[-1]), 1.0).to_event(2))
    h = x @ w.T
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal((h @ w).sum(-1), 1.0), obs=y)


_DEFAULT = object()


def _fit(model=None, guide=None, x=_DEFAULT, y=_DEFAULT, **kw):
    x0, y0 = _data()
    model = model if model is not None else _mlp()
    guide = guide if guide is not None else AutoDropout(model)
    kw.setdefault("num_steps", 1)
    kw.setdefault("progress", False)
    kw.setdefault("jit", False)
    return fit(model, guide, x0 if x is _DEFAULT else x, y0 if y is _DEFAULT else y, **kw)


def _nan_y(row):
    x, y = _data()
    y = y.clone()
    y[row] = float("nan")
    return x, y


def _loader(n=256, row=None, batch=32):
    x, y = _data(1, n)
    if row is not None:
        y[row] = float("inf")
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def _predict(x=None, guide=None, model=None, **kw):
    m, g = _fitted()
    return predict(model or m, guide or g, _data()[0] if x is None else x, num_samples=3, **kw)


def _export(**kw):
    m, g = _fitted()
    x, y = _data()
    kw = {"x": x, "y": y, **kw}
    return pd.to_inference_data(m, kw.pop("guide", g), num_samples=3, **kw)


def _compare(**kw):
    m, g = _fitted()
    x, y = _data()
    kw = {"x": x, "y": y, "num_samples": 3, "on_error": "raise", **kw}
    return pd.compare({"dropout": (m, g)}, **kw)


def _reference(**kw):
    from pyro_dropout.diagnostics import reference_posterior

    x, y = _data()
    kw = {"y": y, "num_chains": 1, "num_warmup": 2, "num_samples": 2, "processes": 1, **kw}
    return reference_posterior(Tutorial(), x, **kw)


def _module(model=None, **kw):
    # lightning first: importorskip skips on a missing module only, and pyro_dropout.lightning
    # raises an ImportError of its own (with the install line) when lightning is missing
    pytest.importorskip(
        "lightning", reason="needs the lightning extra: pip install -e '.[lightning]'"
    )
    import pyro_dropout.lightning as lightning_module

    model = model if model is not None else _mlp()
    guide = kw.pop("guide", None) or AutoDropout(_mlp())
    return lightning_module.BayesianModule(model, guide, **kw)


def _trainer_nan_row():
    lightning = pytest.importorskip(
        "lightning", reason="needs the lightning extra: pip install -e '.[lightning]'"
    )
    import pyro_dropout.lightning as lm

    loader = _loader(row=200)
    model = _mlp()
    module = lm.BayesianModule(model, AutoDropout(model), example=next(iter(loader)), seed=0)
    trainer = lightning.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)


def _predictive_lrt(x_cols=4):
    m, g = _fitted()
    pred = local_reparameterization(Predictive(m, guide=g, num_samples=2))
    return pred(torch.randn(5, x_cols))


def _strict_reuse():
    x, y = _data()
    guide = AutoMeanField(tied)
    with local_reparameterization(strict=True):
        fit(
            tied,
            guide,
            x,
            y,
            num_steps=1,
            progress=False,
            jit=False,
            local_reparameterization=False,
        )


def _other_model_guide(entry):
    m, g = _fitted()
    other = _mlp(hidden=16)
    if entry == "fit":
        return _fit(other, g)
    return predict(other, g, _data()[0], num_samples=2)


def _ll(y, model=None):
    if model is None:
        m, g = _fitted()
    else:
        pyro.set_rng_seed(0)
        m = model
        g = AutoMeanField(m)
        x, _ = _data()
        g(x, (x[:, 0] > 0).float())
    return predict(m, g, _data()[0], num_samples=2).log_likelihood(y)


# (id, callable, error type, pattern naming the argument)
CASES = [
    # -- fit ---------------------------------------------------------------------------------
    (
        "fit-y-two-columns",
        lambda: _fit(y=torch.randn(N, 2)),
        ValueError,
        r"y (has shape|of shape) \(40, 2\)",
    ),
    ("fit-y-rows", lambda: _fit(y=torch.randn(N - 1)), ValueError, r"x has 40 rows but y has 39"),
    ("fit-x-columns", lambda: _fit(x=torch.randn(N, 5)), ValueError, r"x of shape \(40, 5\)"),
    (
        "fit-x-empty",
        lambda: _fit(x=torch.zeros(0, D), y=torch.zeros(0)),
        ValueError,
        r"x has no rows",
    ),
    ("fit-x-string", lambda: _fit(x="abc"), TypeError, r"x must be a tensor"),
    (
        "fit-y-nan",
        lambda: _fit(None, None, *_nan_y(7)),
        ValueError,
        r"y has a non-finite.*row 7",
    ),
    ("fit-num-data-float", lambda: _fit(num_data=2.5), ValueError, r"num_data must be a positive"),
    ("fit-num-data-str", lambda: _fit(num_data="256"), ValueError, r"num_data must be a positive"),
    ("fit-num-data-bool", lambda: _fit(num_data=True), ValueError, r"num_data must be a positive"),
    ("fit-num-data-in-memory", lambda: _fit(num_data=10), ValueError, r"num_data=10 but x has 40"),
    ("fit-num-steps-zero", lambda: _fit(num_steps=0), ValueError, r"num_steps must be a positive"),
    ("fit-batch-size-zero", lambda: _fit(batch_size=0), ValueError, r"batch_size must be a posit"),
    ("fit-validate", lambda: _fit(validate="sometimes"), ValueError, r"validate must be"),
    ("fit-jit", lambda: _fit(jit="yes"), ValueError, r"jit must be"),
    ("fit-steps-and-epochs", lambda: _fit(num_epochs=1), ValueError, r"num_steps and num_epochs"),
    ("fit-guide-other-model", lambda: _other_model_guide("fit"), ValueError, r"guide.*built for"),
    ("fit-model-args-type", lambda: _fit(model_args=torch.ones(N)), TypeError, r"model_args must"),
    ("fit-model-kwargs-type", lambda: _fit(model_kwargs=[1]), TypeError, r"model_kwargs must"),
    (
        "fit-model-args-loader",
        lambda: fit(_mlp(), AutoDropout(_mlp()), _loader(), num_steps=1, model_args=(1,)),
        ValueError,
        r"model_args / model_kwargs",
    ),
    (
        "fit-loader-num-data-below-batch",
        lambda: _fit(x=_loader(), y=None, num_data=10),
        ValueError,
        r"num_data=10 is smaller than the 32 rows",
    ),
    (
        "fit-loader-nan-row",
        lambda: _fit(x=_loader(row=200), y=None, num_epochs=1, num_steps=None),
        ValueError,
        r"y has a non-finite value .* in row 200",
    ),
    (
        "fit-weights-in-plate",
        lambda: _fit(InPlate(), AutoMeanField(InPlate())),
        ValueError,
        r"'lin.weight' is sampled inside the subsampled plate 'data'.*before the plate",
    ),
    (
        "fit-label-outside-support",
        lambda: _fit(softmax_reg, AutoMeanField(softmax_reg), y=torch.full((N,), 3)),
        ValueError,
        r"y row 0 holds 3, outside the support",
    ),
    (
        "fit-label-not-whole",
        lambda: _fit(softmax_reg, AutoMeanField(softmax_reg), y=torch.full((N,), 0.5)),
        ValueError,
        r"y row 0 holds 0.5",
    ),
    # -- predict -----------------------------------------------------------------------------
    (
        "predict-unfitted",
        lambda: predict(_mlp(), AutoDropout(_mlp()), _data()[0]),
        RuntimeError,
        r"predict: the guide has not been fitted",
    ),
    ("predict-x-empty", lambda: _predict(torch.zeros(0, D)), ValueError, r"x has no rows"),
    (
        "predict-x-columns",
        lambda: _predict(torch.randn(N, 5)),
        ValueError,
        r"x of shape \(40, 5\).*first layer takes 3 input features",
    ),
    (
        "predict-num-samples",
        lambda: predict(*_fitted(), _data()[0], num_samples=0),
        ValueError,
        r"num_samples must be",
    ),
    (
        "predict-guide-other-model",
        lambda: _other_model_guide("predict"),
        ValueError,
        r"guide.*built for",
    ),
    (
        "predict-loglik-shape",
        lambda: _ll(torch.randn(N // 2, 2)),
        ValueError,
        r"y has shape \(20, 2\).*has shape \(40, 1\)",
    ),
    (
        "predict-loglik-not-whole",
        lambda: _ll(torch.full((N,), 0.5), logreg),
        ValueError,
        r"y must hold whole numbers",
    ),
    # -- Predictive under local reparameterisation --------------------------------------------
    ("predictive-lrt-x-columns", _predictive_lrt, ValueError, r"has 4 features .* takes 3"),
    (
        "predictive-lrt-estimator",
        lambda: local_reparameterization(estimator="bogus"),
        ValueError,
        r"estimator must be",
    ),
    (
        "lrt-strict-message",
        _strict_reuse,
        NotImplementedError,
        r"local_reparameterization\(strict=True\) was passed; without strict it is a warning\.",
    ),
    # -- to_inference_data ---------------------------------------------------------------------
    (
        "export-unfitted",
        lambda: pd.to_inference_data(_mlp(), AutoDropout(_mlp()), *_data(), 3),
        RuntimeError,
        r"to_inference_data: the guide has not been fitted",
    ),
    (
        "export-y-test-nan",
        lambda: _export(x_test=_data(2)[0], y_test=_nan_y(3)[1]),
        ValueError,
        r"y_test has a non-finite value .* in row 3",
    ),
    (
        "export-y-test-shape",
        lambda: _export(x_test=_data(2)[0], y_test=torch.randn(N, 2)),
        ValueError,
        r"y_test (has shape|of shape) \(40, 2\)",
    ),
    (
        "export-y-test-alone",
        lambda: _export(y_test=_data(2)[1]),
        ValueError,
        r"y_test was given without x_test",
    ),
    ("export-x-columns", lambda: _export(x=torch.randn(N, 5)), ValueError, r"x of shape \(40, 5\)"),
    (
        "export-num-samples",
        lambda: pd.to_inference_data(*_fitted(), *_data(), 0),
        ValueError,
        r"num_samples must be",
    ),
    # -- compare -------------------------------------------------------------------------------
    ("compare-empty", lambda: pd.compare({}), ValueError, r"fits must be a non-empty dict"),
    ("compare-no-data", lambda: pd.compare({"a": _fitted()}), ValueError, r"pass x= and y="),
    ("compare-sort-by", lambda: _compare(sort_by="bogus"), ValueError, r"sort_by must be"),
    (
        "compare-y-shape",
        lambda: _compare(y=torch.randn(N, 3)),
        ValueError,
        r"y (has shape|of shape) \(40, 3\)",
    ),
    (
        "compare-y-test-nan",
        lambda: _compare(x_test=_data(2)[0], y_test=_nan_y(5)[1]),
        ValueError,
        r"y_test has a non-finite value .* in row 5",
    ),
    # -- reference_posterior -------------------------------------------------------------------
    ("reference-num-chains", lambda: _reference(num_chains=0), ValueError, r"num_chains must be"),
    (
        "reference-y-shape",
        lambda: _reference(y=torch.randn(N, 2)),
        ValueError,
        r"y (has shape|of shape) \(40, 2\)",
    ),
    (
        "reference-y-nan",
        lambda: _reference(y=_nan_y(4)[1]),
        ValueError,
        r"y has a non-finite.*row 4",
    ),
    (
        "reference-x-columns",
        lambda: (
            _reference(x=None)
            if False
            else pd.diagnostics.reference_posterior(
                Tutorial(),
                torch.randn(N, 5),
                _data()[1],
                num_chains=1,
                num_warmup=2,
                num_samples=2,
                processes=1,
            )
        ),
        ValueError,
        r"x of shape \(40, 5\)",
    ),
    # -- BayesianModule ------------------------------------------------------------------------
    ("module-num-data-float", lambda: _module(num_data=2.5), ValueError, r"num_data must be a pos"),
    ("module-num-data-str", lambda: _module(num_data="256"), ValueError, r"num_data must be a pos"),
    ("module-num-data-bool", lambda: _module(num_data=True), ValueError, r"num_data must be a pos"),
    ("module-model-type", lambda: _module(model=logreg), TypeError, r"the model must be a torch"),
    ("module-validate", lambda: _module(validate="no"), ValueError, r"validate must be"),
    (
        "module-example-y-shape",
        lambda: _module(example=(_data()[0], torch.randn(N, 2))),
        ValueError,
        r"y (has shape|of shape) \(40, 2\)",
    ),
    (
        "module-example-x-columns",
        lambda: _module(example=(torch.randn(N, 5), _data()[1])),
        ValueError,
        r"x of shape \(40, 5\)",
    ),
    ("module-trainer-nan-row", _trainer_nan_row, ValueError, r"y has a non-finite .* in row 200"),
    # -- bayesianize ---------------------------------------------------------------------------
    ("bayesianize-not-module", lambda: bayesianize("net"), TypeError, r"module must be a torch"),
    ("bayesianize-lstm", lambda: bayesianize(nn.LSTM(3, 4)), TypeError, r"deterministic="),
    # -- the guides' constructors --------------------------------------------------------------
    ("dropout-rate", lambda: AutoDropout(_mlp(), dropout_rate=1.5), ValueError, r"dropout_rate"),
    ("dropout-scale", lambda: AutoDropout(_mlp(), scale="a"), ValueError, r"scale must be"),
    (
        "mean-field-init-scale",
        lambda: AutoMeanField(_mlp(), init_scale=0),
        ValueError,
        r"init_scale must be",
    ),
    (
        "mean-field-init-scale-str",
        lambda: AutoMeanField(_mlp(), init_scale="a"),
        ValueError,
        r"init_scale must be",
    ),
    ("vd-alpha", lambda: AutoVariationalDropout(_mlp(), alpha="x"), ValueError, r"alpha must be"),
    (
        "vd-init-log-alpha",
        lambda: AutoVariationalDropout(_mlp(), init_log_alpha="a"),
        ValueError,
        r"init_log_alpha must",
    ),
    (
        "concrete-init-rate",
        lambda: AutoConcreteDropout(_mlp(), init_rate=1.0),
        ValueError,
        r"init_rate must be",
    ),
    (
        "concrete-temperature",
        lambda: AutoConcreteDropout(_mlp(), temperature=0),
        ValueError,
        r"temperature must be",
    ),
]


@pytest.mark.parametrize(("call", "error", "pattern"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_misuse_names_the_argument(call, error, pattern):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's start-up notes; the error is the point
        with pytest.raises(error, match=pattern) as info:
            call()
    assert "Pass strict=True to make this an error" not in str(info.value)


def test_the_suite_has_at_least_40_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


# -- warnings of num_data --------------------------------------------------------------------


def test_num_data_that_differs_from_the_dataset_warns():
    pyro.set_rng_seed(0)
    model = _mlp()
    with pytest.warns(UserWarning, match=r"num_data=2560 but the DataLoader's dataset has 256"):
        fit(model, AutoDropout(model), _loader(), num_epochs=1, num_data=2560, progress=False,
            jit=False)  # fmt: skip


# -- the same numbers for a trailing singleton axis -------------------------------------------


def test_compare_with_a_column_target_gives_the_numbers_of_a_flat_one():
    """The issue's case: y of shape (N, 1) for a (N,) site (elpd_loo was -1.07e6)."""
    pyro.set_rng_seed(0)
    x, y = _data()
    xt, yt = _data(3, 20)
    model = Tutorial()
    guide = AutoMeanField(model)
    fit(model, guide, x, y, num_steps=20, lr=1e-2, progress=False, jit=False)
    tables = []
    for yy, yyt in ((y, yt), (y[:, None], yt[:, None])):
        pyro.set_rng_seed(1)
        t = pd.compare({"mf": (model, guide)}, x=x, y=yy, x_test=xt, y_test=yyt, num_samples=30)
        tables.append(t)
    for col in ("elpd_loo", "test_lpd"):
        assert tables[0][col].iloc[0] == tables[1][col].iloc[0]
    assert tables[0]["elpd_loo"].iloc[0] > -1000  # not an (N, N) broadcast (-6e3 before)


def test_fit_with_a_column_target_gives_the_losses_of_a_flat_one():
    x, y = _data()
    losses = []
    for yy in (y, y[:, None]):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = Tutorial()
        losses.append(fit(model, AutoMeanField(model), x, yy, num_steps=3, progress=False))
    assert losses[0] == losses[1]


def test_integer_labels_of_a_bernoulli_site_are_cast():
    x, y = _data()
    labels = (y > 0).long()
    out = []
    for yy in (labels, labels.float()):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = AutoMeanField(logreg)
        out.append(fit(logreg, guide, x, yy, num_steps=3, progress=False, jit=False))
        pyro.set_rng_seed(1)
        out.append(predict(logreg, guide, x, num_samples=4).log_likelihood(yy).sum().item())
    assert out[0] == out[2] and out[1] == out[3]


def test_integer_x_is_cast_when_the_model_computes_in_floating_point():
    x, y = _data()
    xi = x.round().long()
    out = []
    for xx in (xi, xi.float(), xi.numpy()):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = _mlp()
        out.append(fit(model, AutoDropout(model), xx, y, num_steps=3, progress=False, jit=False))
    assert out[0] == out[1] == out[2]


def test_integer_x_is_kept_when_the_model_indexes_with_it():
    """Group indices stay integers (a lookup table)."""

    def groups(x, y=None):
        effects = pyro.sample("effects", dist.Normal(torch.zeros(4), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(effects[x[:, 0]], 1.0), obs=y)

    x = torch.randint(0, 4, (N, 1))
    y = torch.randn(N)
    pyro.set_rng_seed(0)
    guide = AutoMeanField(groups)
    losses = fit(groups, guide, x, y, num_steps=2, progress=False, jit=False)
    assert all(math.isfinite(v) for v in losses)


# -- fit(model_args=..., model_kwargs=...) ----------------------------------------------------


def offset_model(x, offset, y=None, scale=1.0):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[-1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w + offset, scale), obs=y)


def test_fit_passes_model_args_and_slices_per_row_tensors():
    """A tensor with one row per row of x is sliced with each minibatch; others pass whole."""
    x, y = _data()
    offset = 10 * x[:, 0]  # per row: each minibatch must get the rows of its x
    table = torch.arange(7.0)  # not per row: passed whole
    seen = []

    def spy(x, offset, y=None, table=None, scale=1.0):
        seen.append((x.shape[0], torch.equal(offset, 10 * x[:, 0]), table.shape[0], scale))
        return offset_model(x, offset, y, scale)

    pyro.set_rng_seed(0)
    guide = AutoMeanField(spy)
    fit(spy, guide, x, y, num_steps=4, batch_size=16, progress=False, jit=False,
        model_args=(offset,), model_kwargs={"table": table, "scale": 0.5})  # fmt: skip
    assert {rows for rows, *_ in seen[1:]} == {16, 8}
    assert all(ok and t == 7 and s == 0.5 for _, ok, t, s in seen)


def test_model_args_give_the_loss_of_a_closure():
    x, y = _data()
    offset = torch.linspace(-1, 1, N)
    losses = []
    for how in ("args", "closure"):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        if how == "args":
            guide = AutoMeanField(offset_model)
            losses.append(fit(offset_model, guide, x, y, num_steps=3, progress=False, jit=False,
                              model_args=(offset,)))  # fmt: skip
        else:

            def closed(x, y=None):
                return offset_model(x, offset, y)

            guide = AutoMeanField(closed)
            losses.append(fit(closed, guide, x, y, num_steps=3, progress=False, jit=False))
    assert losses[0] == losses[1]


# -- properties ---------------------------------------------------------------------------------

_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

_OURS = (ValueError, TypeError)


def _is_ours(e):
    """The library's own error: a ValueError/TypeError whose message names an argument."""
    text = str(e)
    return isinstance(e, _OURS) and any(k in text for k in ("x", "y", "num_data"))


_FITTED = {}


def _shared_fit():
    if "m" not in _FITTED:
        _FITTED["m"] = _fitted(5)
    return _FITTED["m"]


shapes_x = st.sampled_from([(N, D), (N, 5), (N,), (N, D, 1), (0, D), (N, 1)])
shapes_y = st.sampled_from([(N,), (N, 1), (N, 2), (N - 1,), (N, 1, 1), (1, N), ()])
dtypes = st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool])


@_SETTINGS
@given(sx=shapes_x, sy=shapes_y, dx=dtypes, dy=dtypes)
def test_fit_only_raises_its_own_errors(sx, sy, dx, dy):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = (torch.randn(sx) * 2).to(dx)
    y = torch.randn(sy).to(dy) if sy != () else torch.tensor(1.0)
    model = _mlp()
    try:
        losses = _fit(model, AutoDropout(model), x, y)
    except Exception as e:  # noqa: BLE001 - the property: only the library's own errors
        assert _is_ours(e), f"{type(e).__name__}: {e}"
        return
    assert all(math.isfinite(v) for v in losses)
    # the only shapes accepted: a (N,) or (N, 1) target, one row per row of x
    assert tuple(y.shape) in ((N,), (N, 1)) and x.shape[0] == N


@_SETTINGS
@given(num_data=st.one_of(st.integers(-3, 10**7), st.floats(allow_nan=True), st.text(max_size=3),
                          st.booleans()))  # fmt: skip
def test_fit_num_data_is_checked(num_data):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # num_data != len(dataset)
        try:
            fit(model, AutoDropout(model), _loader(64, batch=16), num_steps=1, num_data=num_data,
                progress=False, jit=False)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the property
            assert isinstance(e, ValueError) and "num_data" in str(e), f"{type(e).__name__}: {e}"
            return
    assert isinstance(num_data, int) and not isinstance(num_data, bool) and num_data >= 16


@_SETTINGS
@given(sx=shapes_x, dx=dtypes, sy=shapes_y)
def test_predict_only_raises_its_own_errors(sx, dx, sy):
    m, g = _shared_fit()
    x = (torch.randn(sx) * 2).to(dx)
    try:
        pred = predict(m, g, x, num_samples=3, seed=0)
        ll = pred.log_likelihood(torch.randn(sy) if sy != () else torch.tensor(1.0))
    except Exception as e:  # noqa: BLE001 - the property
        assert _is_ours(e), f"{type(e).__name__}: {e}"
        return
    assert ll.shape == (x.shape[0],)


@_SETTINGS
@given(trailing=st.booleans(), dy=st.sampled_from([torch.float32, torch.float64]))
def test_predict_log_likelihood_is_the_same_for_a_trailing_axis(trailing, dy):
    m, g = _shared_fit()
    x, y = _data(4)
    pred = predict(m, g, x, num_samples=5, seed=0)
    a = pred.log_likelihood(y.to(dy))
    b = pred.log_likelihood((y[:, None] if trailing else y).to(dy))
    assert torch.equal(a, b)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(sy=st.sampled_from([(N,), (N, 1), (N, 2), (N - 1,)]), numpy=st.booleans())
def test_compare_only_raises_its_own_errors_and_never_broadcasts(sy, numpy):
    m, g = _shared_fit()
    x, y = _data()
    yy = torch.randn(sy) if sy not in ((N,), (N, 1)) else y.reshape(sy)
    yy = yy.numpy().astype(np.float64) if numpy else yy
    pyro.set_rng_seed(0)
    try:
        table = pd.compare({"a": (m, g)}, x=x, y=yy, num_samples=30, on_error="raise")
    except Exception as e:  # noqa: BLE001 - the property
        assert _is_ours(e), f"{type(e).__name__}: {e}"
        return
    pyro.set_rng_seed(0)
    flat = pd.compare({"a": (m, g)}, x=x, y=y, num_samples=30, on_error="raise")
    assert table["elpd_loo"].iloc[0] == pytest.approx(flat["elpd_loo"].iloc[0], rel=1e-6)

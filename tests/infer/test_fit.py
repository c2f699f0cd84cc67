"""``fit``: argument checks, step accounting, callbacks, seeding and divergence reporting."""

import math

import pyro
import pytest
import torch

from pyro_dropout import AutoDropout, AutoMeanField, AutoVariationalDropout, BayesianMLP, fit

GUIDES = {
    "dropout": lambda m: AutoDropout(m, dropout_rate=0.1),
    "mean_field": lambda m: AutoMeanField(m),
    "variational_dropout": lambda m: AutoVariationalDropout(m),
}


def _data(n=40):
    torch.manual_seed(0)
    x = torch.randn(n, 3)
    return x, x[:, 0] - x[:, 2] + 0.1 * torch.randn(n)


def _setup(tau=25.0, guide="mean_field"):
    model = BayesianMLP(3, 1, hidden=(8,), tau=tau)
    return model, GUIDES[guide](model)


@pytest.fixture
def validation_off():
    pyro.enable_validation(False)
    yield
    pyro.enable_validation(True)


# --------------------------------------------------------------------------------------------
# argument errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(num_steps=3, num_epochs=1)], ids=["neither", "both"]
)
def test_exactly_one_of_num_steps_and_num_epochs(kwargs):
    x, y = _data()
    model, guide = _setup()
    with pytest.raises(ValueError, match="exactly one of num_steps and num_epochs"):
        fit(model, guide, x, y, progress=False, **kwargs)


def test_x_y_length_mismatch():
    x, y = _data()
    model, guide = _setup()
    with pytest.raises(ValueError, match="x has 40 rows but y has 39"):
        fit(model, guide, x, y[:-1], num_steps=1, progress=False)


@pytest.mark.parametrize("kwargs", [dict(num_steps=0), dict(num_epochs=0)])
def test_zero_steps(kwargs):
    x, y = _data()
    model, guide = _setup()
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))} must be a positive integer"):
        fit(model, guide, x, y, progress=False, **kwargs)


def test_bad_batch_size():
    x, y = _data()
    model, guide = _setup()
    with pytest.raises(ValueError, match="batch_size"):
        fit(model, guide, x, y, num_steps=1, batch_size=0, progress=False)


def test_minibatch_without_num_data_scales_the_observed_sites():
    """A model without ``num_data`` gets minibatches whose observed sites are scaled by N/B:
    the same loss as the library's model told num_data=N."""
    x, y = _data()
    net = BayesianMLP(3, 1, hidden=(4,), tau=1.0)

    def model(x, y=None):
        return net(x, y)

    guide = AutoMeanField(model, init_scale=1e-8)  # nearly deterministic: losses comparable
    fit(model, guide, x, y, num_steps=1, progress=False)
    from pyro_dropout.infer import MeanFieldELBO
    from pyro_dropout.infer.minibatch import ScaleObserved

    elbo = MeanFieldELBO()
    with ScaleObserved(40 / 8):
        scaled = elbo.loss(model, guide, x[:8], y[:8])
    reference = elbo.loss(net, guide, x[:8], y[:8], num_data=40)
    assert scaled == pytest.approx(reference, rel=1e-4)
    losses = fit(model, guide, x, y, num_epochs=2, batch_size=8, progress=False)
    assert len(losses) == 10
    # full batch is fine, and so is a batch as large as the data
    assert len(fit(model, guide, x, y, num_steps=2, progress=False)) == 2
    assert len(fit(model, guide, x, y, num_steps=2, batch_size=40, progress=False)) == 2


# --------------------------------------------------------------------------------------------
# step accounting
# --------------------------------------------------------------------------------------------


def test_returns_one_loss_per_step():
    x, y = _data()
    model, guide = _setup()
    losses = fit(model, guide, x, y, num_steps=7, progress=False, seed=0)
    assert len(losses) == 7
    assert all(isinstance(loss, float) and math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("batch_size, steps_per_epoch", [(16, 3), (20, 2), (40, 1), (None, 1)])
def test_epochs_count_minibatches(batch_size, steps_per_epoch):
    x, y = _data()
    model, guide = _setup()
    losses = fit(model, guide, x, y, num_epochs=2, batch_size=batch_size, progress=False, seed=0)
    assert len(losses) == 2 * steps_per_epoch


def test_minibatches_cover_each_epoch_and_pass_num_data():
    """Each epoch visits every row once, in batches of B (last one short); the model is called
    with num_data=N (its plate then scales the likelihood by N/B, see tests/nn)."""
    x, y = _data()
    model, guide = _setup()
    seen = []

    def spy(x_batch, y_batch=None, num_data=None):
        seen.append((x_batch.clone(), num_data))
        return model(x_batch, y_batch, num_data=num_data)

    # eager: a compiled loss runs the model only while tracing, so the spy would not see it
    fit(spy, guide, x, y, num_epochs=2, batch_size=16, progress=False, seed=0, jit=False)
    calls = [(xb, n) for xb, n in seen if n is not None]
    assert len(calls) == 6 and all(n == 40 for _, n in calls)
    for epoch in range(2):
        rows = torch.cat([xb for xb, _ in calls[3 * epoch : 3 * epoch + 3]])
        assert rows.shape == x.shape
        assert torch.equal(rows[rows[:, 0].argsort()], x[x[:, 0].argsort()])
    assert [xb.shape[0] for xb, _ in calls[:3]] == [16, 16, 8]


def test_loss_decreases_on_an_easy_problem():
    x, y = _data(100)
    model, guide = _setup(tau=100.0)
    losses = fit(model, guide, x, y, num_steps=300, lr=0.02, progress=False, seed=0)
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20


def test_progress_bar_can_be_shown(capsys):
    x, y = _data()
    model, guide = _setup()
    losses = fit(model, guide, x, y, num_steps=3, progress=True, seed=0)
    assert len(losses) == 3
    assert "fit AutoMeanField" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# callbacks and seeds
# --------------------------------------------------------------------------------------------


def test_callback_sees_every_step_and_can_stop_early():
    x, y = _data()
    model, guide = _setup()
    calls = []

    def callback(step, loss):
        calls.append((step, loss))
        return step == 4

    losses = fit(model, guide, x, y, num_steps=50, callback=callback, progress=False, seed=0)
    assert len(losses) == 5
    assert [s for s, _ in calls] == [0, 1, 2, 3, 4]
    assert [loss for _, loss in calls] == losses


def test_callback_returning_falsy_values_does_not_stop():
    x, y = _data()
    model, guide = _setup()
    losses = fit(model, guide, x, y, num_steps=4, callback=lambda s, l: None, progress=False)
    assert len(losses) == 4


@pytest.mark.parametrize("guide_name", GUIDES)
@pytest.mark.parametrize("batch_size", [None, 16], ids=["full", "minibatch"])
def test_same_seed_gives_identical_losses(guide_name, batch_size):
    x, y = _data()
    runs = []
    for _ in range(2):
        pyro.clear_param_store()
        model, guide = _setup(tau=None, guide=guide_name)
        runs.append(
            fit(model, guide, x, y, num_steps=8, batch_size=batch_size, progress=False, seed=3)
        )
    assert runs[0] == runs[1]
    pyro.clear_param_store()
    model, guide = _setup(tau=None, guide=guide_name)
    other = fit(model, guide, x, y, num_steps=8, batch_size=batch_size, progress=False, seed=4)
    assert other != runs[0]


def test_custom_optimiser_is_used():
    x, y = _data()
    model, guide = _setup()
    losses = fit(model, guide, x, y, num_steps=3, optim=pyro.optim.SGD({"lr": 0.0}), progress=False)
    before = {k: v.detach().clone() for k, v in guide.median().items()}
    fit(model, guide, x, y, num_steps=3, optim=pyro.optim.SGD({"lr": 0.0}), progress=False)
    for k, v in guide.median().items():
        assert torch.equal(v, before[k])
    assert len(losses) == 3


# --------------------------------------------------------------------------------------------
# divergence
# --------------------------------------------------------------------------------------------


def test_infinite_loss_raises_floating_point_error_with_advice():
    """A noise precision so large that the scaled squared error overflows float32."""
    x, y = _data()
    model, guide = _setup(tau=1e38)
    with pytest.raises(FloatingPointError, match=r"loss became inf at step 0.*learning rate"):
        fit(model, guide, x, y, num_steps=5, progress=False, seed=0)


@pytest.mark.usefixtures("validation_off")
def test_huge_learning_rate_raises_floating_point_error():
    """With Pyro's argument validation off, a diverging fit reports the non-finite loss.

    (With validation on, Pyro's own ``ValueError`` about a NaN ``loc`` comes first; reported.)
    """
    x, y = _data()
    model, guide = _setup()
    with pytest.warns(UserWarning, match="Encountered NaN: loss"):  # Pyro's own warning
        with pytest.raises(FloatingPointError, match=r"loss became nan at step \d+.*learning rate"):
            fit(model, guide, x, y, num_steps=50, lr=1e30, progress=False, seed=0)


# --------------------------------------------------------------------------------------------
# validation only where shapes are new
# --------------------------------------------------------------------------------------------


def _recording_model(model, flags):
    def recorded(x, y=None, num_data=None):
        flags.append(pyro.infer.util.is_validation_enabled())
        return model(x, y, num_data=num_data)

    return recorded


@pytest.mark.parametrize(
    "validate, expected",
    [
        # 40 rows in batches of 16: shapes 16, 16, 8 per epoch; model runs once per step
        ("first", [True, False, True, False, False, False]),
        ("always", [True] * 6),
        ("never", [False] * 6),
    ],
)
def test_validation_runs_on_the_first_step_of_each_shape(validate, expected):
    x, y = _data()
    model, guide = _setup()
    flags = []
    fit(
        _recording_model(model, flags),
        guide,
        x,
        y,
        num_epochs=2,
        batch_size=16,
        validate=validate,
        progress=False,
        jit=False,  # eager: one model run per step (a compiled loss runs it only while tracing)
    )
    # the last six model runs are the six steps (the guide's set-up ran the model once more)
    assert flags[-6:] == expected


def test_validation_stays_off_when_disabled_globally(validation_off):
    x, y = _data()
    model, guide = _setup()
    flags = []
    fit(_recording_model(model, flags), guide, x, y, num_steps=3, batch_size=16, progress=False)
    assert not any(flags)


def test_bad_validate_value():
    x, y = _data()
    model, guide = _setup()
    with pytest.raises(ValueError, match="validate must be 'first', 'always' or 'never'"):
        fit(model, guide, x, y, num_steps=1, validate="sometimes", progress=False)

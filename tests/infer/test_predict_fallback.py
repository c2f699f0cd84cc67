"""Never silent (issue 39): a model that does not broadcast over a leading draw dimension gets
one draw per pass under ``vectorize="auto"``, with one :class:`VectorizationWarning` per run
that names the exception, the cost and ``vectorize=False``; the numbers are those of
``vectorize=False``, which warns nothing."""

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_dropout import AutoMeanField, predict, to_inference_data
from pyro_dropout.diagnostics import samples_inference_data
from pyro_dropout.diagnostics._arviz_compat import get_group
from pyro_dropout.infer.draws import NotVectorizable, VectorizationWarning
from pyro_dropout.infer.draws import run as run_module

N, D = 7, 3


def row_loop_model(x, y=None):
    """A Python loop over rows: ``torch.dot`` takes one weight vector, so a vectorised pass
    (weights of shape ``(draws, 1, D)``) raises in the model's own code."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    mu = torch.stack([torch.dot(row, w) for row in x]) + b
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 0.5), obs=y)
    return mu


@pytest.fixture
def fitted():
    pyro.clear_param_store()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = x.sum(-1) + 0.1 * torch.randn(N, generator=g)
    guide = AutoMeanField(row_loop_model)
    guide(x, y)  # set up the guide (a fit would not change what is tested)
    return guide, x, y


# where the fallback starts: the check pass (a user's model is checked before its first
# vectorised pass), or the first vectorised pass itself (a model the check skips)
@pytest.mark.parametrize("where", ["check", "pass"])
def test_fallback_warns_once_and_equals_vectorize_false(fitted, where, monkeypatch):
    guide, x, _ = fitted
    if where == "pass":
        monkeypatch.setattr(run_module, "needs_check", lambda model: False)
    seq = predict(row_loop_model, guide, x, num_samples=25, seed=3, vectorize=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # chunk_size=4: six vectorised passes would follow the first draw; one warning
        auto = predict(row_loop_model, guide, x, num_samples=25, seed=3, chunk_size=4)
    assert [w.category for w in caught] == [VectorizationWarning]
    message = str(caught[0].message)
    assert "does not broadcast over a leading draw dimension" in message
    assert "raised RuntimeError: 1D tensors expected" in message  # the exception, named
    assert "Trace Shapes" not in message  # Pyro's shape table of the failed trace, cut off
    assert "one model run per draw instead of one per 4 draws" in message
    assert "vectorize=False" in message
    assert caught[0].filename == __file__  # the user's line, not the library's
    torch.testing.assert_close(auto.samples, seq.samples, rtol=0, atol=0)
    torch.testing.assert_close(auto.mean, seq.mean, rtol=0, atol=0)


def test_vectorize_false_is_silent_and_true_raises(fitted):
    guide, x, _ = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(row_loop_model, guide, x, num_samples=10, seed=0, vectorize=False)
    with pytest.raises(NotVectorizable, match="does not broadcast"):
        predict(row_loop_model, guide, x, num_samples=10, seed=0, vectorize=True)


def test_one_draw_runs_no_vectorised_pass_and_warns_nothing(fitted):
    guide, x, _ = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(row_loop_model, guide, x, num_samples=1, seed=0)


def test_export_warns_once_at_the_user_line(fitted):
    """``to_inference_data`` runs the draws inside the library, twice with ``prior=True``
    (posterior and prior, both falling back): one warning, naming the caller's line."""
    guide, x, y = fitted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        to_inference_data(row_loop_model, guide, x, y, num_samples=12, seed=0, prior=True)
    caught = [w for w in caught if issubclass(w.category, VectorizationWarning)]
    assert len(caught) == 1 and caught[0].filename == __file__


def test_samples_export_warns_once_and_equals_parallel_false():
    """The export of stored draws (MCMC) tried a vectorised replay and silently started again
    one draw per pass; now it says so, once, at the user's line."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g)
    y = x.sum(-1)
    samples = {"w": torch.randn(10, D, generator=g), "b": torch.randn(10, generator=g)}
    seq = samples_inference_data(row_loop_model, samples, x, y, seed=0, parallel=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = samples_inference_data(row_loop_model, samples, x, y, seed=0)
    caught = [w for w in caught if issubclass(w.category, VectorizationWarning)]
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "does not broadcast" in str(caught[0].message)
    assert "parallel=False" in str(caught[0].message)
    ll_seq = get_group(seq, "log_likelihood")["obs"].values
    ll_auto = get_group(auto, "log_likelihood")["obs"].values
    np.testing.assert_array_equal(ll_auto, ll_seq)


def broadcasting_model(x, y=None):
    """The same regression written to broadcast over leading draw dimensions."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    mu = (x * w).sum(-1) + b  # w: (draws, 1, D) beside the data plate
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 0.5), obs=y)
    return mu


def test_samples_export_of_a_broadcasting_user_model_vectorises():
    """Found by the warning: the vectorisation check drew one stored draw from the
    SamplesGuide and the last vectorised pass asked for one draw too many ("SamplesGuide asked
    for draw 11 of 10"), so every MCMC export of a user's model fell back, silently, and
    parallel=True raised. The check's draw is no longer used up."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N, D, generator=g)
    y = x.sum(-1)
    samples = {"w": torch.randn(10, D, generator=g), "b": torch.randn(10, generator=g)}
    seq = samples_inference_data(broadcasting_model, samples, x, y, seed=0, parallel=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vec = samples_inference_data(broadcasting_model, samples, x, y, seed=0, parallel=True)
        auto = samples_inference_data(broadcasting_model, samples, x, y, seed=0)
    ll_seq = get_group(seq, "log_likelihood")["obs"].values
    for d in (vec, auto):
        ll = get_group(d, "log_likelihood")["obs"].values
        np.testing.assert_allclose(ll, ll_seq, rtol=1e-6, atol=1e-6)

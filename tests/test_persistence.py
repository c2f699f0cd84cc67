"""Saving and loading a fit (docs/saving-and-loading.md): state dicts, Pyro's param store and
whole objects, across processes; and the names a guide's parameters take in Pyro's global
param store (pyro_dropout/guides/store_names.py)."""

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyro
import pytest
import torch

from pyro_dropout import (
    AutoConcreteDropout,
    AutoDropout,
    AutoMeanField,
    AutoVariationalDropout,
    BayesianConvNet,
    BayesianMLP,
    bayesianize,
    fit,
    predict,
)
from pyro_dropout.nn import BayesianModel

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [AutoDropout, AutoMeanField, AutoVariationalDropout, AutoConcreteDropout]


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, (x.sum(-1, keepdim=True) * 0.5).tanh()


def _model(hidden=(8,)):
    return BayesianMLP(3, 1, hidden=hidden, tau=None)  # a latent noise scale: a positive site


def _fitted(cls, *, num_steps=60, seed=0, **kwargs):
    x, y = _data()
    model = _model()
    guide = cls(model, **kwargs)
    fit(model, guide, x, y, num_steps=num_steps, lr=0.05, progress=False, seed=seed)
    return model, guide


def _draws(model, guide, seed=1):
    return predict(model, guide, _data()[0], num_samples=4, seed=seed).samples


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)  # whole objects: see the docs page


# --------------------------------------------------------------------------------------------
# whole objects: torch.save / torch.load
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: BayesianMLP(3, 1, hidden=(4,), tau=10.0),
        lambda: BayesianMLP(3, 1, hidden=(4,), tau=None, activation="identity"),
        lambda: BayesianMLP(3, 1, hidden=(4,), tau=10.0, prior="learned", bias_prior="learned"),
        lambda: BayesianMLP(3, 1, hidden=(4,), tau=10.0, prior="hyper"),
        lambda: BayesianMLP(3, 1, hidden=(4,), likelihood="heteroscedastic"),
        lambda: BayesianModel(
            bayesianize(
                torch.nn.Sequential(
                    torch.nn.Linear(3, 4),
                    torch.nn.ReLU(),
                    torch.nn.Dropout(),
                    torch.nn.Linear(4, 1),
                )
            ),
            likelihood="regression",
            tau=10.0,
        ),
    ],
    ids=["mlp", "latent-noise-identity", "learned-prior", "hyper-prior", "hetero", "bayesianize"],
)
def test_models_pickle_and_sample_the_same_prior_draws(make):
    """On b220d6f: "Can't pickle local object '_BayesianLayer._setup_sites.<locals>..." (the
    layers' PyroSample priors were lambdas)."""
    model = make()
    x = _data()[0]
    copy = _roundtrip(model)
    pyro.set_rng_seed(3)
    before = pyro.poutine.trace(model).get_trace(x)
    pyro.set_rng_seed(3)
    after = pyro.poutine.trace(copy).get_trace(x)
    sites = [n for n, s in before.nodes.items() if s["type"] == "sample"]
    assert sites == [n for n, s in after.nodes.items() if s["type"] == "sample"]
    for name in sites:
        torch.testing.assert_close(after.nodes[name]["value"], before.nodes[name]["value"])


def test_a_bayesian_conv_net_pickles():
    model = BayesianConvNet(1, 3, image_size=12, channels=(2, 3), hidden=4, kernel_size=3)
    copy = _roundtrip(model)
    x = torch.randn(2, 1, 12, 12)
    pyro.set_rng_seed(3)
    a = model(x)
    pyro.set_rng_seed(3)
    torch.testing.assert_close(copy(x), a)


@pytest.mark.parametrize("cls", GUIDES)
def test_fitted_model_and_guide_objects_load_and_predict_the_same(cls):
    model, guide = _fitted(cls)
    before = _draws(model, guide)
    saved = _roundtrip({"model": model, "guide": guide})
    guide = None  # the library collects it (it holds its model through a reference cycle)
    torch.testing.assert_close(_draws(saved["model"], saved["guide"]), before, rtol=0, atol=0)


def test_a_loaded_guide_refuses_to_share_names_with_the_live_original():
    model, guide = _fitted(AutoMeanField)
    copy = _roundtrip(guide)
    with pytest.raises(RuntimeError, match="loaded or copied.*del guide"):
        _draws(model, copy)


def test_a_loaded_guide_replaces_other_values_under_its_names_and_says_so():
    model, guide = _fitted(AutoMeanField)
    before = _draws(model, guide)
    copy = _roundtrip(guide)
    guide = None  # the library collects it (it holds its model through a reference cycle)
    pyro.clear_param_store()
    _fitted(AutoMeanField, num_steps=5, seed=7, name="other")  # unrelated, under another name
    store = pyro.get_param_store()
    store["AutoMeanField.locs.net.layers.0.bias"] = torch.full((8,), 3.0)  # as if loaded
    with pytest.warns(UserWarning, match="replace them"):
        after = _draws(model, copy)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# names in Pyro's param store
# --------------------------------------------------------------------------------------------


def test_a_cell_run_twice_reuses_the_name_and_starts_afresh():
    """On b220d6f the second run's guide was "AutoMeanField_1" (a new process's first guide
    is "AutoMeanField"), and the store kept both fits."""
    x, y = _data()
    inits, names = [], []
    for _ in range(2):
        model = _model()
        guide = AutoMeanField(model)
        pyro.set_rng_seed(5)
        inits.append(guide.median(x, y))
        names.append(guide._pyro_name)
        fit(model, guide, x, y, num_steps=30, lr=0.05, progress=False, seed=0)
    assert names == ["AutoMeanField", "AutoMeanField"]
    for site, value in inits[0].items():  # the second run starts from its own initialisation
        torch.testing.assert_close(inits[1][site], value, rtol=0, atol=0)
    assert all(k.startswith("AutoMeanField.") for k in pyro.get_param_store().keys())


def test_a_live_guide_keeps_its_parameters_from_a_second_one():
    x, y = _data()
    model, first = _fitted(AutoMeanField)
    fitted = {k: v.clone() for k, v in first.median().items()}
    with pytest.warns(UserWarning, match="uses 'AutoMeanField_1'.*name="):
        second = AutoMeanField(model, init_scale=0.5)
        second(x, y)
    fit(model, second, x, y, num_steps=10, lr=0.05, progress=False, seed=1)
    for site, value in first.median().items():  # the first one did not move
        torch.testing.assert_close(value, fitted[site], rtol=0, atol=0)
    mine = AutoMeanField(model, name="mine")
    mine(x, y)
    with pytest.raises(ValueError, match="another live guide already stores.*'mine'"):
        AutoMeanField(model, name="mine")(x, y)


def test_a_guide_whose_name_was_taken_after_the_store_was_cleared_refuses_to_run():
    """Pyro would let the first guide adopt the second's parameters at its next use."""
    x, y = _data()
    model, first = _fitted(AutoMeanField, num_steps=5)
    pyro.clear_param_store()
    second = AutoMeanField(model)
    second(x, y)  # the name is free in the store: the second takes it
    assert second._pyro_name == first._pyro_name == "AutoMeanField"
    with pytest.raises(RuntimeError, match="clear_param_store.*own name="):
        first(x, y)
    del second
    first(x, y)  # the other is gone: the first takes its name back, with its own values


@pytest.mark.parametrize("bad", ["", ".", 3])
def test_name_must_be_a_non_empty_string(bad):
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        AutoMeanField(_model(), name=bad)


def _save_store(path, **kwargs):
    model, guide = _fitted(AutoMeanField, **kwargs)
    before = _draws(model, guide)
    pyro.get_param_store().save(path)
    pyro.clear_param_store()
    return before


def test_the_store_loads_into_a_guide_of_the_same_name_in_the_same_session(tmp_path):
    before = _save_store(tmp_path / "store.pt", name="run_b")
    pyro.get_param_store().load(tmp_path / "store.pt")
    model = _model()
    guide = AutoMeanField(model, name="run_b")
    medians = guide.median(*_data())  # set-up outside a model run reads the store too
    assert torch.equal(medians["net.layers.0.bias"], pyro.param("run_b.locs.net.layers.0.bias"))
    torch.testing.assert_close(_draws(model, guide), before, rtol=0, atol=0)


def test_a_guide_that_finds_its_class_under_other_names_says_which_to_use(tmp_path):
    """The failure of issue 39: a new guide ignored the loaded AutoMeanField_1.* entries and
    predicted from its initialisation, without a word."""
    before = _save_store(tmp_path / "store.pt", name="AutoMeanField_1")
    pyro.get_param_store().load(tmp_path / "store.pt")
    model = _model()
    with pytest.raises(RuntimeError, match=r"Found: AutoMeanField_1\.locs.*Expected: AutoMeanF"):
        AutoMeanField(model)(*_data())
    assert any(k.startswith("AutoMeanField_1.") for k in pyro.get_param_store().keys())
    assert not any(k.startswith("AutoMeanField.") for k in pyro.get_param_store().keys())
    with pytest.raises(RuntimeError, match="name='AutoMeanField_1'"):
        AutoMeanField(model)(*_data())
    guide = AutoMeanField(model, name="AutoMeanField_1")
    guide(*_data())
    torch.testing.assert_close(_draws(model, guide), before, rtol=0, atol=0)


def test_a_store_of_another_architecture_is_refused_and_kept(tmp_path):
    _save_store(tmp_path / "store.pt")
    pyro.get_param_store().load(tmp_path / "store.pt")
    saved = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    with pytest.raises(RuntimeError, match=r"do not match it.*Shapes \(stored vs this guide"):
        AutoMeanField(_model(hidden=(6,)))(*_data())
    store = pyro.get_param_store()
    assert set(store.keys()) == set(saved)  # a failed set-up leaves the loaded entries alone
    for k, v in saved.items():
        assert torch.equal(store[k].detach(), v)
    with pytest.raises(RuntimeError, match=r"Missing: AutoMeanField\.locs\.net\.layers\.2"):
        AutoMeanField(_model(hidden=(8, 8)))(*_data())


# --------------------------------------------------------------------------------------------
# across processes
# --------------------------------------------------------------------------------------------

_COMMON = """
import sys
import torch, pyro
from pyro_dropout import (AutoConcreteDropout, AutoDropout, AutoMeanField,
                          AutoVariationalDropout, BayesianMLP, fit, predict)
GUIDES = [AutoDropout, AutoMeanField, AutoVariationalDropout, AutoConcreteDropout]
out = sys.argv[1]
g = torch.Generator().manual_seed(0)
x = torch.randn(40, 3, generator=g)
y = (x.sum(-1, keepdim=True) * 0.5).tanh()
def make_model():
    return BayesianMLP(3, 1, hidden=(8,), tau=None)
def draws(model, guide):
    return predict(model, guide, x, num_samples=4, seed=1).samples
"""

_SAVE = """
draws_before, keep = {}, []
for cls in GUIDES:
    for run in range(2):  # a notebook cell run twice: the second fit is the one saved
        model = make_model()
        guide = cls(model)
        fit(model, guide, x, y, num_steps=60, lr=0.05, progress=False, seed=run)
    name = cls.__name__
    draws_before[name] = draws(model, guide)
    torch.save({"model": model.state_dict(), "guide": guide.state_dict()}, f"{out}/{name}.sd.pt")
    keep.append((model, guide))
pyro.get_param_store().save(f"{out}/store.pt")
torch.save(draws_before, f"{out}/before.pt")
for model, guide in keep:  # last, and apart: on b220d6f the model did not pickle
    try:
        torch.save({"model": model, "guide": guide}, f"{out}/{type(guide).__name__}.obj.pt")
    except Exception as e:
        print(f"{type(guide).__name__}: {e!r}", file=sys.stderr)
"""

_LOAD = """
route = sys.argv[2]
if route == "param_store":
    pyro.get_param_store().load(f"{out}/store.pt")
got = {}
for cls in GUIDES:
    name = cls.__name__
    if route == "state_dict":
        model = make_model()
        guide = cls(model)
        guide(x, y)  # creates the parameters, which load_state_dict then overwrites
        sd = torch.load(f"{out}/{name}.sd.pt", weights_only=True)
        model.load_state_dict(sd["model"])
        guide.load_state_dict(sd["guide"])
    elif route == "param_store":
        model = make_model()
        guide = cls(model)
        guide(x, y)  # creates the parameters from the store's entries of its names
    else:
        saved = torch.load(f"{out}/{name}.obj.pt", weights_only=False)
        model, guide = saved["model"], saved["guide"]
    got[name] = draws(model, guide)
torch.save(got, f"{out}/got_{route}.pt")
"""


def _env():
    env = dict(os.environ)
    # this checkout first, then whatever the test run had
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _python(code, *args):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COMMON + code), *map(str, args)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def saved_fits(tmp_path_factory):
    out = tmp_path_factory.mktemp("fits")
    _python(_SAVE, out)
    return out


@pytest.mark.parametrize("route", ["state_dict", "param_store", "objects"])
def test_a_fit_saved_in_one_process_predicts_the_same_in_another(saved_fits, route):
    """On b220d6f the param-store route predicted from the guides' initialisation (the saving
    process had named the saved fits "<Class>_1"), and the objects did not pickle."""
    _python(_LOAD, saved_fits, route)
    before = torch.load(saved_fits / "before.pt", weights_only=True)
    got = torch.load(saved_fits / f"got_{route}.pt", weights_only=True)
    assert set(got) == {cls.__name__ for cls in GUIDES}
    for name, draws in got.items():
        torch.testing.assert_close(draws, before[name], rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------------------------
# the docs page's code, as written (fewer steps)
# --------------------------------------------------------------------------------------------

PAGE = ROOT / "docs" / "saving-and-loading.md"


def _page_blocks():
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def test_the_docs_page_saves_in_one_process_and_loads_in_another(tmp_path):
    """Blocks 0-1, 3 and 6 save; in a new process 2, 4 and 7 load (each route after the
    previous one's guide is gone) and predict what the saving process predicted."""
    b = [code.replace("num_steps=1500", "num_steps=100") for code in _page_blocks()]
    assert len(b) == 9 and "save_atomically" in b[8]
    head = b[0].split("model = ")[0]  # imports and data, no fit
    save = "\n".join([b[0], b[1], b[3], b[6], "torch.save(before, 'before.pt')"])
    load = "\n".join(
        [head, "before = torch.load('before.pt', weights_only=True)", "results = []"]
        + [
            f"{b[i]}\nresults.append(torch.equal(after, before))\ndel model, guide"
            for i in (2, 4, 7)
        ]
        + ["assert results == [True, True, True], results"]
    )
    ns = {"torch": torch}
    exec(compile(b[8], str(PAGE), "exec"), ns)  # noqa: S102 - the page's own code
    ns["save_atomically"]({"a": torch.ones(2)}, tmp_path / "a.pt")
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["a"], torch.ones(2))
    with pytest.raises(Exception, match="pickle"):
        ns["save_atomically"]({"a": lambda: 0}, tmp_path / "a.pt")
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["a"], torch.ones(2))
    for code in (save, load):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]

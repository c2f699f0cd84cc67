"""Checkpoints of the UCI engine's training (``benchmarks/uci_model/checkpoint.py``): a training
stopped and resumed ends where an uninterrupted one does, for every engine that draws its random
numbers in step order; a checkpoint of another run is refused; SIGTERM saves and stops."""

import math
import os
import signal
from pathlib import Path

import pyro
import pytest
import torch

from benchmarks import uci, uci_model
from benchmarks.uci_model.checkpoint import Checkpoint, Interrupted
from pyro_dropout.datasets import load_uci

from ._uci import UCI_DIR

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def yacht():
    if not (UCI_DIR / "yacht" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    return load_uci("yacht", UCI_DIR)


def _train(ds, guide, depth, total, checkpoint=None, max_steps=None, jit=True):
    """Build the quick grid's members of splits 0-1 afresh (as a new process would) and
    train them; returns the stats and every parameter by name."""
    configs = uci_model.grid(guide, ds.dropout_rates, ds.tau_values, quick=True)
    x, y, *_, std = uci._stack_split_arrays(ds, [0, 1], validation=False)
    g = len(configs)
    members = uci_model.Members(
        [c for _ in (0, 1) for c in configs], std.repeat_interleave(g), x.shape[1]
    )
    torch.manual_seed(123)  # the builders' initial values: a resumed run must not depend on them
    model, guide_, _ = uci_model.build(
        guide, ds.n_features, ds.n_hidden, members, hidden_layers=depth
    )
    stats = uci_model.train(
        model, guide_, x, y, g, total, seed=5, checkpoint=checkpoint, max_steps=max_steps,
        jit=jit,
    )  # fmt: skip
    # by attribute: each build numbers its guide (uci_dropout_<n>.locs...), the model's own
    # parameters (learned_sd) have no prefix
    prefix = guide_._pyro_name + "."
    params = {
        k.removeprefix(prefix): v.detach().clone()
        for k, v in pyro.get_param_store().named_parameters()
    }
    return stats, params


class _StopAfter(Checkpoint):
    """A checkpoint whose SIGTERM arrives after ``n`` steps (as ``pkill`` mid-run would)."""

    def __init__(self, path, key, n):
        super().__init__(path, key, every_s=0)
        self.calls, self.n = 0, n

    def due(self):
        self.calls += 1
        if self.calls == self.n:
            # (never the default handler, which would end the test process)
            assert signal.getsignal(signal.SIGTERM) == self._on_term
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
        return super().due()


@pytest.mark.parametrize(
    ("guide", "depth", "jit"),
    [("dropout", 1, True), ("meanfield", 1, True), ("dropout", 2, True), ("vd", 2, False)],
)
def test_a_training_stopped_by_sigterm_resumes_from_exactly_its_saved_state(
    yacht, tmp_path, guide, depth, jit
):
    """Fused (one layer), traced and eager (two layers) engines: SIGTERM mid-epoch saves the
    state after the step in flight and stops; a fresh build resumes with those parameters,
    that Adam state, those random states and that epoch's row order, and trains to the end."""
    epochs = 3  # yacht: 3 steps an epoch at batch 128; stop mid-epoch
    ref_stats, ref4 = _train(yacht, guide, depth, epochs, jit=jit, max_steps=4)
    path = tmp_path / "ck.pt"
    key = {"run": guide, "depth": depth}
    with pytest.raises(Interrupted, match="step 4 of 9"):
        _train(yacht, guide, depth, epochs, checkpoint=_StopAfter(path, key, 4), jit=jit)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    saved = torch.load(path, weights_only=False)
    assert saved["step"] == 4 and saved["resumed_at"] == ()
    prefix = saved["guide_name"] + "."
    params = {k.removeprefix(prefix): v for k, v in saved["params"]["params"].items()}
    assert params.keys() == ref4.keys()  # the state after 4 steps, as an uninterrupted run's
    for name in ref4:
        torch.testing.assert_close(params[name].detach(), ref4[name], rtol=0, atol=0, msg=name)
    assert saved["order"].shape == (yacht.split(0)[0].shape[0],)

    seen = {}
    real_restore = Checkpoint.restore

    def restore(self, state, optim, guide_name=None):
        real_restore(self, state, optim, guide_name)
        seen["rng"] = torch.get_rng_state()
        seen["optim"] = optim

    Checkpoint.restore = restore
    try:
        stats, got = _train(yacht, guide, depth, epochs, checkpoint=Checkpoint(path, key), jit=jit)
    finally:
        Checkpoint.restore = real_restore
    assert torch.equal(seen["rng"], saved["rng"]["torch"])
    # Adam went on from step 4 with the saved moments: its state now is 9 steps
    state = seen["optim"].get_state()["state_dict"]["state"]
    assert {float(s["step"]) for s in state.values()} == {9.0}
    assert stats.resumed_at == (4,) and stats.steps == 9 and stats.engine == ref_stats.engine
    assert math.isfinite(stats.final_loss)
    assert any(not torch.equal(got[k], ref4[k]) for k in ref4)  # it trained on
    # the resumed run saved its end of training (a sitting stopping during the evaluation)
    end = torch.load(path, weights_only=False)
    assert end["step"] == 9 and end["resumed_at"] == (4,)


def test_restore_gives_the_optimiser_its_moments_under_the_new_guide_name(tmp_path):
    """Steps after restoring are the steps the saved optimiser would have taken, with the
    guide's parameters renamed from the saved guide's name to the new one's."""
    from pyro_dropout.infer import fused_adam

    def grads(w, b, t):
        return (w * torch.arange(3.0)).sin().sum() + (b - t).pow(2).sum()

    def run(name, schedule, checkpoint=None, restore_from=None):
        pyro.clear_param_store()
        optim = fused_adam({"lr": 0.01})
        if restore_from is not None:
            restore_from.restore(restore_from.load(), optim, guide_name=name)
        w = pyro.param(f"{name}.w", torch.ones(3))
        b = pyro.param("b", torch.zeros(2))  # a model parameter: no guide prefix
        for t in schedule:
            grads(w, b, t).backward()
            optim([w, b])
            optim.clear_grads([w, b])
        if checkpoint is not None:
            checkpoint.save(optim, guide_name=name)
        return w.detach().clone(), b.detach().clone()

    ck = Checkpoint(tmp_path / "ck.pt", {"run": 1})
    run("uci_x_0", (0, 1, 2), checkpoint=ck)
    got = run("uci_x_7", (3, 4), restore_from=ck)
    assert set(pyro.get_param_store().keys()) == {"uci_x_7.w", "b"}
    w = torch.ones(3, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    ref = torch.optim.Adam([w, b], lr=0.01)
    for t in (0, 1, 2, 3, 4):
        ref.zero_grad()
        grads(w, b, t).backward()
        ref.step()
    torch.testing.assert_close(got[0], w.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], b.detach(), rtol=1e-6, atol=1e-7)
    # without the moments (a fresh Adam from step 3's values) the result differs: it can fail
    fresh = run("uci_x_9", (3, 4))
    assert not torch.allclose(fresh[1], got[1])


def test_a_checkpoint_of_another_run_is_refused(yacht, tmp_path):
    path = tmp_path / "ck.pt"
    with pytest.raises(Interrupted):
        _train(yacht, "dropout", 1, 3, checkpoint=_StopAfter(path, {"splits": [0, 1]}, 2))
    with pytest.raises(RuntimeError, match="belongs to another run.*splits"):
        Checkpoint(path, {"splits": [0, 2]}).load()


def test_the_driver_resumes_a_phase_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    """`--resume` continues a phase that SIGTERM stopped (its checkpoint left, no unit yet),
    records where it resumed, and deletes the checkpoint once the units are written."""
    from ._uci import yacht_argv

    out = tmp_path / "out"
    argv = yacht_argv(UCI_DIR, out, "concrete", "--epochs", "4", "--mc-samples", "20")
    real = uci_model.checkpoint.Checkpoint.due
    calls = {"n": 0}

    def stop_at_the_fifth_step(self):
        calls["n"] += 1
        if calls["n"] == 5:
            assert signal.getsignal(signal.SIGTERM) == self._on_term
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(uci_model.checkpoint.Checkpoint, "due", stop_at_the_fifth_step)
        with pytest.raises(Interrupted):
            uci.main(argv)
    left = list(Path(out, "checkpoints").rglob("*.pt"))
    assert len(left) == 1
    assert not list(Path(out, "units").rglob("split_*.json"))
    capsys.readouterr()
    uci.main([*[a for a in argv if a != "--quiet"], "--resume"])
    err = capsys.readouterr().err
    assert "resuming from" in err and "at step 5 (" in err  # the log says where it resumed
    units = sorted(Path(out, "units", "yacht", "concrete").glob("split_*.json"))
    assert [u.name for u in units] == ["split_0.json", "split_1.json"]
    rec = uci.units._read_json(units[0])
    assert rec["final_fit"]["resumed_at_steps"] == [5]
    assert not list(Path(out, "checkpoints").rglob("*.pt"))


def test_sigterm_during_the_last_step_stops_after_saving_the_trained_state(yacht, tmp_path):
    path = tmp_path / "ck.pt"
    with pytest.raises(Interrupted, match="training finished"):
        # due() is asked after every step but the last: the 8th call follows step 8 of 9
        _train(yacht, "dropout", 1, 3, checkpoint=_StopAfterLast(path, {"run": 1}))
    assert torch.load(path, weights_only=False)["step"] == 9


class _StopAfterLast(Checkpoint):
    """SIGTERM during the last step (after the loop's last ``due()``)."""

    def __init__(self, path, key):
        super().__init__(path, key, every_s=0)
        self.calls = 0

    def due(self):
        self.calls += 1
        if self.calls == 8:  # the flag is set, but due() is not asked again before the end
            self._stop = True
            return False
        return super().due()

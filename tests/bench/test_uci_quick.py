"""The UCI benchmark script: --quick smoke run on yacht, resume, errors, and its building blocks
(the LL accumulated over chunks equals ``Prediction.log_likelihood``; the dropout objective
equals the reference Keras objective up to a constant factor; the embedded published numbers
match ``published_results.md``)."""

import functools
import json
import math
import re
import shutil
import time

import pyro
import pytest
import torch

from benchmarks import uci, uci_model
from benchmarks.uci.report import _best_published
from benchmarks.uci_published import (
    BEST_PUBLISHED,
    PUBLISHED,
    PUBLISHED_COLUMNS,
    PUBLISHED_TWO_LAYER,
    SE_BASES,
)
from pyro_dropout import Prediction
from pyro_dropout.datasets import load_uci
from pyro_dropout.infer import MeanFieldELBO
from pyro_dropout.nn.likelihoods import GaussianLikelihood

pytestmark = pytest.mark.usefixtures("one_thread")

GUIDES = ("dropout", "meanfield", "vd", "concrete", "concrete-tau")
#: The default guides of a run: the above and issue 24's "<guide>-hetero" configurations.
ALL_GUIDES = tuple(uci_model.GUIDES)


def _finite_numbers(obj):
    if isinstance(obj, dict):
        return all(_finite_numbers(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return all(_finite_numbers(v) for v in obj)
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def test_quick_run_writes_results_and_resume_skips_finished_units(data_dir, tmp_path):
    out = tmp_path / "uci"
    argv = ["--data-dir", str(data_dir), "--datasets", "yacht", "--out", str(out), "--quick"]
    t0 = time.perf_counter()
    summary = uci.main(argv + ["--quiet"])
    first = time.perf_counter() - t0

    saved = json.loads((out / "summary.json").read_text())
    entry = saved["datasets"]["yacht"]
    assert set(entry["guides"]) == set(ALL_GUIDES)
    for guide in ALL_GUIDES:
        agg = entry["guides"][guide]
        assert agg["splits"] == [0, 1]
        for key in ("rmse", "ll", "rmse_mean_weights"):
            assert math.isfinite(agg[key]["mean"]) and math.isfinite(agg[key]["se"])
        assert agg["rmse"]["mean"] > 0
        assert agg["reduced"]  # quick mode is marked as a reduced budget
        for k in (0, 1):
            unit = json.loads((out / "units" / "yacht" / guide / f"split_{k}.json").read_text())
            assert unit["status"] == "done" and unit["split"] == k
            assert _finite_numbers(unit["test"])
            if guide == "concrete-tau":  # learned noise; the test τ factor from validation
                cal = unit["validation"]["tau_calibration"]
                assert unit["settings"]["grid"] == [{"noise": "learned"}]
                assert unit["validation"]["configs"][0]["tau_eval"] == cal["learned_tau"]
                assert math.isclose(cal["tau"], cal["learned_tau"] * cal["factor"])
                assert cal["val_ll"] >= unit["validation"]["configs"][0]["val_ll"]
                assert unit["chosen"] == {"noise": "learned", "tau_factor": cal["factor"]}
                test = unit["test"]
                assert math.isclose(test["tau"], test["tau_learned"] * cal["factor"])
                continue
            assert unit["chosen"] in unit["settings"]["grid"]
            if guide == "concrete":  # one configuration: no validation phase
                assert unit["validation"] is None and len(unit["settings"]["grid"]) == 1
                rates = unit["learned_dropout_rates"]
                assert sorted(rates) == ["layers.0.weight", "layers.1.weight"]
                assert all(len(r) == 1 and 0 < r[0] < 1 for r in rates.values())
                assert not (out / "units" / "yacht" / guide / f"split_{k}.val.json").exists()
            elif len(unit["settings"]["grid"]) == 1:  # "<guide>-hetero": one configuration
                assert unit["validation"] is None
                assert unit["chosen"] == {"noise": "heteroscedastic"}
            else:
                assert len(unit["validation"]["configs"]) == len(unit["settings"]["grid"])
                assert all(math.isfinite(c["val_ll"]) for c in unit["validation"]["configs"])
            assert re.fullmatch(r"[0-9a-f]{40}", unit["code"]["commit"])
            assert isinstance(unit["code"]["dirty"], bool)
            assert unit["wall_s"] > 0 and unit["final_fit"]["steps_per_s"] > 0
    md = (out / "results.md").read_text()
    assert "| yacht |" in md and "†" in md and "0.6663" in md  # ours next to the anchor
    for guide in ALL_GUIDES:
        assert f"ours: {guide}" in md
    assert "## Targets" in md and "| yacht | " in md.split("## Targets")[1]
    concrete_targets = md.split("### Concrete dropout against the anchor")[1]
    for guide in ("concrete", "concrete-tau"):
        assert re.search(
            rf"\| yacht † \| {guide} \| [✅❌] [-+][0-9.e-]+ \| [✅❌] [-+][0-9.e-]+ \| "
            rf"[0-9.]+ \| [0-9.]+ \|",
            concrete_targets,
        )
        assert re.search(rf"- {guide}: the LL meets the target on [01] of 1 dataset", md)
    # quick grid: 4 dropout configurations; concrete 1 / (0.8·4 + 1), concrete-tau 1.8 / 4.2
    assert "| yacht † | concrete | " in md and re.search(r"\| 0\.24 \| [0-9.]+ \|\n", md)
    assert re.search(r"\| yacht † \| concrete-tau \| .* \| 0\.43 \| [0-9.]+ \|", md)
    assert re.search(r"yacht / concrete-tau: tau factor: median [0-9.e+-]+, range", md)
    label = uci.commit_label(unit)
    assert f"- yacht / concrete: {label} (splits 0-1)" in md.split("## Code versions")[1]

    mtimes = {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.json")}
    t0 = time.perf_counter()
    again = uci.main(argv + ["--quiet", "--resume"])
    second = time.perf_counter() - t0
    assert {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.json")} == mtimes
    assert second < max(0.5 * first, 1.0)
    for guide in GUIDES:
        a = summary["datasets"]["yacht"]["guides"][guide]
        b = again["datasets"]["yacht"]["guides"][guide]
        assert a["rmse"] == b["rmse"] and a["ll"] == b["ll"]

    # Resuming with different settings refuses to mix results.
    with pytest.raises(RuntimeError, match="different settings"):
        uci.main(argv + ["--quiet", "--resume", "--epochs", "3"])


def test_resume_reuses_a_finished_validation_phase(data_dir, tmp_path):
    out = tmp_path / "uci"
    argv = ["--data-dir", str(data_dir), "--datasets", "yacht", "--guides", "vd"]
    argv += ["--out", str(out), "--quick", "--splits", "0", "--epochs", "2", "--quiet"]
    uci.main(argv)
    unit_dir = out / "units" / "yacht" / "vd"
    val = (unit_dir / "split_0.val.json").read_text()
    (unit_dir / "split_0.json").unlink()
    uci.main(argv + ["--resume"])
    assert (unit_dir / "split_0.val.json").read_text() == val  # not recomputed
    assert json.loads((unit_dir / "split_0.json").read_text())["status"] == "done"


def test_units_from_before_mc_draws_resume_as_per_example_draws(data_dir, tmp_path):
    """Units written before ``--mc-draws`` existed drew per example: they resume (and are
    summarised) as ``examples``, and a run with the default weight draws refuses to mix."""
    out = tmp_path / "uci"
    argv = ["--data-dir", str(data_dir), "--datasets", "yacht", "--guides", "vd"]
    argv += ["--out", str(out), "--quick", "--splits", "0", "--epochs", "2", "--quiet"]
    uci.main(argv + ["--mc-draws", "examples"])
    unit_dir = out / "units" / "yacht" / "vd"
    for path in unit_dir.glob("*.json"):  # as written by the previous version
        rec = json.loads(path.read_text())
        assert rec["settings"].pop("mc_draws") == "examples"
        path.write_text(json.dumps(rec))
    mtimes = {p: p.stat().st_mtime_ns for p in unit_dir.glob("*.json")}
    again = uci.main(argv + ["--resume", "--mc-draws", "examples"])
    assert {p: p.stat().st_mtime_ns for p in unit_dir.glob("*.json")} == mtimes
    assert again["datasets"]["yacht"]["guides"]["vd"]["settings"]["mc_draws"] == "examples"
    with pytest.raises(RuntimeError, match="mc_draws: 'examples' -> 'weights'"):
        uci.main(argv + ["--resume"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--datasets", "yachts"], r"unknown dataset 'yachts'; valid names are: .*yacht"),
        (["--datasets", "yacht", "--guides", "mcdropout"], r"unknown guide 'mcdropout'"),
        (["--datasets", "yacht", "--splits", "20"], r"yacht has splits 0..19"),
        (["--datasets", "yacht", "--device", "tpu9"], r"--device: "),
    ]
    + (
        []
        if torch.cuda.is_available()
        else [(["--datasets", "yacht", "--device", "cuda"], r"sees no CUDA device")]
    ),
)
def test_bad_names_are_reported(data_dir, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as err:
        uci.main(["--data-dir", str(data_dir), "--out", str(tmp_path)] + extra)
    assert err.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_incomplete_dataset_folder_names_the_missing_file(data_dir, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(data_dir / "yacht", root / "yacht")
    (root / "yacht" / "tau_values.txt").unlink()
    with pytest.raises(SystemExit):
        uci.main(["--data-dir", str(root), "--datasets", "yacht", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "tau_values.txt" in err and "incomplete" in err
    assert not (tmp_path / "o").exists()  # nothing ran


def _deep_getattr(obj, name):
    return functools.reduce(getattr, name.split("."), obj)


def _tiny_batched_fit(data_dir, guide, splits=(0, 1), steps_epochs=3):
    ds = load_uci("yacht", data_dir)
    configs = uci_model.grid(guide, ds.dropout_rates, ds.tau_values, quick=True)
    x, y, xt, yt, mean, std = uci._stack_split_arrays(ds, list(splits), validation=False)
    g = len(configs)
    members = uci_model.Members(
        [c for _ in splits for c in configs], std.repeat_interleave(g), x.shape[1]
    )
    model, guide_, eval_tau = uci_model.build(guide, ds.n_features, ds.n_hidden, members)
    uci_model.train(model, guide_, x, y, g, steps_epochs, lr=1e-2, seed=0)
    return model, guide_, eval_tau, (xt, yt, mean.repeat_interleave(g), std.repeat_interleave(g)), g


@pytest.mark.parametrize("guide", GUIDES)
def test_streamed_metrics_match_prediction_log_likelihood(data_dir, guide):
    model, g, eval_tau, (xt, yt, mean, std), per = _tiny_batched_fit(data_dir, guide)
    tau = eval_tau()
    factors = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    ev = uci_model.evaluate(
        model, g, xt, yt, per, mean, std, tau, 300, keep_samples=True, tau_factors=factors
    )
    samples = ev.samples  # (T, M, N), original scale, float64
    assert samples.shape[:2] == (300, len(tau))
    y_members = yt.repeat_interleave(per, 0)
    for m in range(len(tau)):
        pred = Prediction(samples[:, m, :, None], GaussianLikelihood(tau=float(tau[m])))
        ll = pred.log_likelihood(y_members[m]).mean()
        torch.testing.assert_close(ev.ll[m], ll)
        for k, fac in enumerate(factors):  # the τ scan: the same passes, τ scaled
            like = GaussianLikelihood(tau=float(tau[m] * fac))
            scanned = Prediction(samples[:, m, :, None], like).log_likelihood(y_members[m])
            torch.testing.assert_close(ev.ll_scan[k, m], scanned.mean())
        rmse = ((pred.mean[:, 0] - y_members[m]) ** 2).mean().sqrt()
        torch.testing.assert_close(ev.rmse[m], rmse)
    assert torch.isfinite(ev.rmse_mean_weights).all()


def test_members_are_independent(data_dir):
    """Each member of a batched fit has its own parameters and training signal."""
    model, g, *_ = _tiny_batched_fit(data_dir, "dropout")
    w = g.median()["layers.0.weight"]
    assert w.shape[:2] == (8, 1)  # 2 splits x 4 quick configurations
    assert not torch.allclose(w[0], w[1])
    rates = g.get_distributions()["layers.0.weight"].dropout_rate[:, 0, 0, 0]
    torch.testing.assert_close(rates[:4], torch.tensor([0.005, 0.005, 0.1, 0.1]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dropout_objective_is_the_reference_keras_objective_up_to_a_constant(monkeypatch, seed):
    """Gradient of our loss = (N τ'/2) x gradient of Keras' MSE + λ‖K‖² with inverted dropout.

    One example (N = B = 1), so the weight-space dropout mask of a guide draw is the per-example
    mask of Keras; the mask is read off the draw. A large length-scale makes the weight decay
    as large as the data term, so a wrong τ' (e.g. τ' = τ) fails.
    """
    # build() reads LENGTH_SCALE in uci_model.builders: patch it there
    monkeypatch.setattr(uci_model.builders, "LENGTH_SCALE", 2.0)
    torch.manual_seed(seed)
    n, d, h, tau, p = 1, 3, 6, 0.3, 0.3
    x, y = torch.randn(n, d), torch.randn(n)
    members = uci_model.Members([{"dropout_rate": p, "tau": tau}], torch.ones(1).double(), n)
    model, guide, _ = uci_model.build("dropout", d, h, members)
    pyro.clear_param_store()
    xb, yb = x[None], y[None]
    names = ("layers.0.weight", "layers.1.weight")
    with pyro.validation_enabled(False):
        guide(xb, yb)
        pyro.set_rng_seed(seed)
        loss = MeanFieldELBO(max_plate_nesting=2).differentiable_loss(model, guide, xb, yb)
        pyro.set_rng_seed(seed)  # the ELBO runs the guide first: the same draws
        draws = pyro.poutine.trace(guide).get_trace(xb, yb)
    m = [_deep_getattr(guide.locs, name) for name in names]
    ours = torch.autograd.grad(loss, m)

    # Keras: kernel K = (1 - p) M, inverted dropout (x ⊙ z) / (1 - p), biases unregularised.
    z = [
        ((draws.nodes[nm]["value"] - mi).abs().amax(-2) < 1e-2).float()[0, 0]
        for nm, mi in zip(names, m, strict=True)
    ]
    b1, b2 = (_deep_getattr(guide.locs, f"layers.{i}.bias").detach()[0, 0] for i in (0, 1))
    m1, m2 = (mi.detach()[0, 0].clone().requires_grad_() for mi in m)
    k1, k2 = (1 - p) * m1, (1 - p) * m2
    hidden = torch.relu((x * z[0]) / (1 - p) @ k1.T + b1)
    f = ((hidden * z[1]) / (1 - p) @ k2.T + b2).squeeze(-1)
    lam = uci_model.builders.LENGTH_SCALE**2 * (1 - p) / (2 * n * tau)
    keras = ((y - f) ** 2).mean() + lam * ((k1**2).sum() + (k2**2).sum())
    ref = torch.autograd.grad(keras, (m1, m2))
    factor = n * uci_model.dropout_training_precision(tau, p) / 2
    for a, b in zip(ours, ref, strict=True):
        assert (a[0, 0] - factor * b).norm() < 1e-3 * (factor * b).norm()  # up to the slab noise


def test_dropout_kl_weight_decay_coefficient():
    """The registered KL's ||M||² coefficient is (1-p)/(2 s²): the basis of τ' = 2τ/(1-p)²."""
    from torch.distributions import kl_divergence

    from pyro_dropout import BernoulliMaskedNormal

    s, p = 1 / uci_model.LENGTH_SCALE, 0.1
    prior = pyro.distributions.Normal(torch.zeros(4, 3), s).to_event(2)
    m = torch.randn(4, 3)

    def kl(loc):
        return kl_divergence(BernoulliMaskedNormal(loc, 1e-4, p, event_dim=2), prior)

    torch.testing.assert_close(kl(m) - kl(torch.zeros_like(m)), (1 - p) / (2 * s**2) * (m**2).sum())


def test_embedded_published_numbers_match_the_markdown(data_dir):
    text = (data_dir / "published_results.md").read_text()
    # The one-layer tables come before the two-layer section (its own test, below).
    one_layer, _, _ = text.partition("## Two hidden layers")
    rows = {}
    for line in one_layer.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in PUBLISHED:
            pairs = [tuple(float(v) for v in c.split("±")) for c in cells[1:]]
            rows.setdefault(cells[0], []).append(pairs)
    cols = list(PUBLISHED_COLUMNS)
    for name, (anchor, others) in rows.items():
        pub = PUBLISHED[name]
        assert (pub[cols[0]]["rmse"], pub[cols[0]]["ll"]) == (anchor[0], anchor[1])
        for i, col in enumerate(cols[1:]):
            assert pub[col]["rmse"] == others[i]
            assert pub[col]["ll"] == others[i + 4]
    assert len(rows) == 9


def test_embedded_two_layer_numbers_match_the_markdown(data_dir):
    text = (data_dir / "published_results.md").read_text()
    _, found, two_layer = text.partition("## Two hidden layers")
    assert found, "published_results.md has no two-layer section"
    rows = {}
    for line in two_layer.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in PUBLISHED_TWO_LAYER:
            rmse, ll = (tuple(float(v) for v in c.split("±")) for c in cells[2:4])
            rows[cells[0]] = {"splits": int(cells[1]), "rmse": rmse, "ll": ll}
    assert rows == PUBLISHED_TWO_LAYER


def test_best_published_entries_say_where_their_numbers_come_from():
    assert set(BEST_PUBLISHED) == set(PUBLISHED)
    for name, best in BEST_PUBLISHED.items():
        assert isinstance(best.ll, float) and math.isfinite(best.ll), name
        assert best.se is None or best.se > 0, name
        assert best.se_basis in SE_BASES, name
        assert best.source and best.printed and best.model and best.note, name
        assert isinstance(best.verified, bool), name
        assert best.n_splits is None or best.n_splits > 0, name
        assert best.same_splits in (True, False, None), name
        for extra in (best.bayesian, best.fallback):
            if extra is not None:
                b_ll, b_se, label = extra
                assert math.isfinite(b_ll) and (b_se is None or b_se > 0) and label, name
        # an unverified target names the best Bayesian NN value that was verified
        assert best.verified or best.fallback is not None, name
        ll, se, source, verified = best  # the tuple form of the old table
        assert (ll, se, source, verified) == (best.ll, best.se, best.source, best.verified)
    # an SD over n runs is divided by sqrt(n); the printed NLL is negated
    boston = BEST_PUBLISHED["bostonHousing"]
    assert boston.se_basis == "SD→SE" and boston.printed == "NLL 2.35 ± 0.06"
    assert boston.se == pytest.approx(0.06 / math.sqrt(20))
    # Deep Evidential Regression is not a Bayesian network: its table's best Bayesian NN is kept
    assert all(b.bayesian for b in BEST_PUBLISHED.values() if "Evidential" in b.source)
    # the anchor is the shared file's number, on these splits
    concrete = BEST_PUBLISHED["concrete"]
    assert (concrete.ll, concrete.se) == PUBLISHED["concrete"]["mc_dropout_2018"]["ll"]
    assert concrete.verified and concrete.same_splits


def test_best_published_table_shows_se_basis_and_verification():
    guide = {"ll": {"mean": -1.0, "se": 0.01}, "reduced": False}
    summary = {"datasets": {name: {"guides": {"vd": guide}} for name in BEST_PUBLISHED}}
    rows = {
        line.split("|")[1].strip(): line
        for line in _best_published(summary, ["vd"])
        if line.startswith("| ") and not line.startswith(("| dataset", "| ---"))
    }
    assert set(rows) == set(BEST_PUBLISHED)
    assert "SD→SE, unverified" in rows["bostonHousing"]
    assert rows["bostonHousing"].endswith("| beats (+1.35) |")  # -1.0 against -2.35
    assert rows["yacht"].endswith("| below (-0.53) |")
    weak = {"ll": {"mean": -2.43, "se": 0.03}, "reduced": False}
    lines = _best_published({"datasets": {"bostonHousing": {"guides": {"vd": weak}}}}, ["vd"])
    row = next(line for line in lines if line.startswith("| bostonHousing"))
    assert row.endswith("| below (-0.08) |")
    assert any("**0 of 1** against the issue's numbers" in line for line in lines)
    # issue 40: the Bayesian comparison is one rule, in its own section (test_uci_compare.py)
    assert not any("best verified Bayesian NN" in line for line in lines)
    assert "SE as printed" in rows["concrete"] and "unverified" not in rows["concrete"]
    assert "Table 2" in rows["yacht"] and "± unlabelled" in rows["yacht"]


@pytest.mark.parametrize(
    "ours, anchor, higher, ok",
    [
        ((1.0, 0.1), (1.1, 0.1), False, True),  # better RMSE
        ((1.2, 0.1), (1.1, 0.05), False, True),  # 0.1 worse, SE of the difference 0.112
        ((1.3, 0.1), (1.1, 0.05), False, False),  # 0.2 worse
        ((-1.30, 0.02), (-1.25, 0.02), True, False),  # LL 0.05 worse, SE 0.028
        ((-1.27, 0.02), (-1.25, 0.02), True, True),
    ],
)
def test_target_check_uses_the_standard_error_of_the_difference(ours, anchor, higher, ok):
    assert uci._within(ours, anchor, higher)[1] is ok


def test_report_only_summarises_without_training(data_dir, tmp_path):
    out = tmp_path / "uci"
    base = ["--data-dir", str(data_dir), "--out", str(out), "--quick", "--quiet"]
    uci.main(base + ["--datasets", "yacht", "--guides", "vd"])
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.json")}
    t0 = time.perf_counter()
    summary = uci.main(base + ["--datasets", "yacht,bostonHousing", "--report-only"])
    assert time.perf_counter() - t0 < 5
    assert {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*.json")} == mtimes
    assert set(summary["datasets"]["yacht"]["guides"]) == {"vd"}
    assert summary["datasets"]["bostonHousing"]["guides"] == {}
    md = (out / "results.md").read_text()
    assert "| bostonHousing | – | 2.904" in md  # no row of ours, then the anchor column
    assert "ours: vd" in md and "ours: dropout" not in md  # columns: guides with a row


@pytest.fixture
def clean_commit(monkeypatch):
    """Units written in the test name a commit of a clean tree, whatever this checkout's
    state (``_code_state`` is read once per process: cleared before and after)."""
    from benchmarks.uci import units

    monkeypatch.setenv("PYRO_DROPOUT_COMMIT", "0123abc")
    units._code_state.cache_clear()
    yield
    units._code_state.cache_clear()


def test_merge_and_page_regenerate_a_page_from_several_summaries(
    data_dir, tmp_path, capsys, clean_commit
):
    """``--report-only --merge A --merge B --page P``: rows of later summaries replace earlier
    ones, the units under --out replace both, and the page's marked block is rewritten; the
    page takes only rows that recompute from clean-tree units."""
    import copy

    from benchmarks.uci.report import PAGE_BEGIN, PAGE_END

    out = tmp_path / "uci"
    base = ["--data-dir", str(data_dir), "--datasets", "yacht", "--quick", "--quiet"]
    uci.main(base + ["--out", str(out), "--guides", "vd"])
    first = json.loads((out / "summary.json").read_text())
    older = copy.deepcopy(first)
    older["datasets"]["yacht"]["guides"]["vd"]["ll"]["mean"] = -99.0  # replaced by the units
    older["datasets"]["yacht"]["guides"]["concrete"] = copy.deepcopy(
        first["datasets"]["yacht"]["guides"]["vd"]
    )
    newer = copy.deepcopy(older)
    newer["datasets"]["yacht"]["guides"]["concrete"]["ll"]["mean"] = -7.5  # replaces older
    (tmp_path / "a.json").write_text(json.dumps(older))
    (tmp_path / "b.json").write_text(json.dumps(newer))
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nkept\n{PAGE_BEGIN}\nold text\n{PAGE_END}\n\nkept too\n")
    argv = base + ["--out", str(out), "--report-only"]
    merges = ["--merge", str(tmp_path / "a.json"), "--merge", str(tmp_path / "b.json")]
    merged = uci.main(argv + merges)
    got = merged["datasets"]["yacht"]["guides"]
    assert list(got) == ["vd", "concrete"]  # the order of the guides' table
    assert got["vd"]["ll"]["mean"] == first["datasets"]["yacht"]["guides"]["vd"]["ll"]["mean"]
    assert got["concrete"]["ll"]["mean"] == -7.5
    # The page takes no row without units: b.json's concrete row has none beside it.
    with pytest.raises(SystemExit, match="yacht / concrete: no unit files"):
        uci.main(argv + merges + ["--page", str(page)])
    assert "old text" in page.read_text()  # left as it was
    # A merged summary whose units sit beside it (<folder>/units) is taken; units from an
    # uncommitted tree are not.
    other = tmp_path / "other"
    shutil.copytree(out / "units", other / "units")
    (other / "summary.json").write_text(json.dumps(first))
    uci.main(argv + ["--merge", str(other / "summary.json"), "--page", str(page)])
    unit = sorted((other / "units" / "yacht" / "vd").glob("split_*[0-9].json"))[0]
    record = json.loads(unit.read_text())
    record["code"] = {"commit": "0123456789abcdef", "dirty": True}
    unit.write_text(json.dumps(record))
    shutil.rmtree(out / "units")  # the row now comes from the merged summary alone
    with pytest.raises(SystemExit, match=r"yacht / vd: units from 0123456\+dirty"):
        uci.main(argv + ["--merge", str(other / "summary.json"), "--page", str(page)])
    text = page.read_text()
    assert text.startswith("# Title\n\nkept\n") and text.endswith(f"{PAGE_END}\n\nkept too\n")
    assert "old text" not in text and "# UCI regression benchmark" not in text
    assert "\n### Test log-likelihood\n" in text and "ours: vd" in text
    # markers missing, or --merge without --report-only: the parser says what to change
    page.write_text("no markers\n")
    for extra, message in (
        (["--page", str(page), "--report-only"], "--page: the page needs the lines"),
        (["--merge", str(tmp_path / "a.json")], "only go with --report-only"),
        (["--merge", str(tmp_path / "none.json"), "--report-only"], "no such file"),
    ):
        with pytest.raises(SystemExit):
            uci.main(base + ["--out", str(out)] + extra)
        assert message in capsys.readouterr().err


def test_report_says_which_commit_wrote_which_rows(data_dir, tmp_path):
    """Units without the ``code`` field predate it: reported as written at or before 36cc829."""
    out = tmp_path / "uci"
    base = ["--data-dir", str(data_dir), "--out", str(out), "--quick", "--quiet"]
    uci.main(base + ["--datasets", "yacht", "--guides", "concrete", "--epochs", "1"])
    unit_dir = out / "units" / "yacht" / "concrete"
    old = json.loads((unit_dir / "split_1.json").read_text())
    del old["code"]
    (unit_dir / "split_1.json").write_text(json.dumps(old))
    summary = uci.main(base + ["--datasets", "yacht", "--guides", "concrete", "--report-only"])
    commits = summary["datasets"]["yacht"]["guides"]["concrete"]["commits"]
    new = uci.commit_label(json.loads((unit_dir / "split_0.json").read_text()))
    assert commits == {new: [0], "≤ 36cc829": [1]}
    md = (out / "results.md").read_text()
    assert f"- yacht / concrete: {new} (splits 0); ≤ 36cc829 (splits 1)" in md


@pytest.mark.parametrize(
    "code, label",
    [
        ({"commit": "0123456789abcdef" * 2 + "01234567", "dirty": False}, "0123456"),
        ({"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True}, "0123456+dirty"),
        ({"commit": None, "dirty": None}, "unknown"),
    ],
)
def test_commit_labels(code, label):
    assert uci.commit_label({"code": code}) == label
    assert uci.commit_label({}) == uci.UNRECORDED_COMMIT


def test_split_lists_are_compressed_into_runs():
    assert uci._split_list([5, 0, 1, 2, 7, 8]) == "splits 0-2, 5, 7-8"


def test_estimate_projects_concrete_without_a_validation_phase(data_dir, tmp_path):
    argv = ["--data-dir", str(data_dir), "--out", str(tmp_path), "--datasets", "yacht"]
    rows = uci.main(argv + ["--guides", "concrete", "--splits", "0", "--estimate", "--quiet"])
    (row,) = rows
    assert row["phases"]["validation"] == [] and row["validation_s"] == 0
    assert row["final_s"] > 0 and row["phases"]["final"][0]["members"] == 1
    assert row["phases"]["final"][0]["splits"] == [0] and row["phases"]["final"][0]["jit"]
    assert "| yacht | concrete | 1 | – | 0 | – | 1 |" in (tmp_path / "projection.md").read_text()


def test_constant_noise_ll_is_the_calibrated_gaussian_score():
    """-½ log(2πe r²) equals the mean log-density of N(0, r²) at errors with RMS r."""
    from benchmarks.uci.report import _calibration, constant_noise_ll

    g = torch.Generator().manual_seed(0)
    e = torch.randn(200_000, generator=g, dtype=torch.float64) * 0.3
    r = float(e.pow(2).mean().sqrt())
    exact = float(torch.distributions.Normal(0.0, r).log_prob(e).mean())
    assert constant_noise_ll(r) == pytest.approx(exact, abs=1e-6)
    row = {"rmse": {"mean": 0.3}, "ll": {"mean": constant_noise_ll(0.3) - 0.05}, "reduced": []}
    anchor = {"rmse": (0.3, 0.01), "ll": (constant_noise_ll(0.3) + 0.02, 0.01)}
    summary = {"datasets": {"x": {"guides": {"vd": row}, "published": {"mc_dropout_2018": anchor}}}}
    line = next(s for s in _calibration(summary, ["vd"]) if s.startswith("| x |"))
    assert "| -0.050 |" in line and line.endswith("| +0.020 |")


def test_cuda_graph_flag_needs_a_cuda_device(data_dir, tmp_path, capsys):
    """``--cuda-graph`` records CUDA graphs; on the CPU it is refused, not ignored (the CPU
    route trains on the fused kernels, where a graph would not apply)."""
    with pytest.raises(SystemExit):
        uci.main(["--data-dir", str(data_dir), "--out", str(tmp_path / "o"), "--cuda-graph"])
    assert "--cuda-graph records CUDA graphs: it needs --device cuda" in capsys.readouterr().err


def test_train_refuses_cuda_graph_without_cuda():
    import torch

    um = uci_model
    x, y = torch.randn(1, 16, 3), torch.randn(1, 16)
    grid = um.grid("dropout", [0.1], [1.0])
    members = um.Members([dict(c) for c in grid], torch.ones(len(grid)).double(), 16)
    model, guide, _ = um.build("dropout", 3, 4, members)
    with pytest.raises(ValueError, match="jit on CUDA tensors"):
        um.train(model, guide, x, y, len(grid), 1, batch_size=8, cuda_graph=True)

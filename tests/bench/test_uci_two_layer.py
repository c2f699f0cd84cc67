"""Two hidden layers as a configuration of the UCI driver (issue 40, item 2): the network, the
units' settings and engine, resume across depths, ``--estimate`` and the report's comparator."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import uci, uci_fused
from benchmarks import uci_model as um
from benchmarks.uci.cli import _parser, _resolve
from benchmarks.uci.protocol import protocol
from benchmarks.uci_published import PUBLISHED_TWO_LAYER
from pyro_dropout.datasets import load_uci

from ._uci import yacht_argv

pytestmark = pytest.mark.usefixtures("one_thread")

#: yacht: 6 inputs, 50 hidden units.
YACHT_NET = [6, 50, 50, 1]


def _argv(data_dir, out, guides="dropout"):
    return yacht_argv(data_dir, out, guides, "--splits", "0")


@pytest.fixture(scope="module")
def two_layer_run(data_dir, tmp_path_factory):
    """One quick two-layer run (yacht, split 0): the dropout guide (fused on one layer) and
    concrete (whose units record one learned rate per layer)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("uci2") / "out"
        argv = _argv(data_dir, out, "dropout,concrete") + ["--hidden-layers", "2"]
        summary = uci.main(argv)
    finally:
        torch.set_num_threads(threads)
    return out, argv, summary


def test_network_has_the_requested_hidden_layers():
    m = um.Members([{"dropout_rate": 0.05, "tau": 1.0}], torch.ones(1), 10)
    one, _, _ = um.build("dropout", 6, 50, m)
    two, _, _ = um.build("dropout", 6, 50, m, hidden_layers=2)
    assert [(la.in_features, la.out_features) for la in one.layers] == [(6, 50), (50, 1)]
    assert [(la.in_features, la.out_features) for la in two.layers] == [
        (6, 50),
        (50, 50),
        (50, 1),
    ]
    torch.manual_seed(0)
    x = torch.randn(1, 5, 6)
    with torch.no_grad():
        assert two(x).shape == (1, 5)
    het, _, _ = um.build("vd-hetero", 6, 50, um.Members([{}], torch.ones(1), 10), hidden_layers=2)
    assert [la.out_features for la in het.layers] == [50, 50, 2]  # mean and noise scale
    with torch.no_grad():
        assert het(x).shape == (1, 5, 2)
    with pytest.raises(ValueError, match="hidden_layers must be a positive integer"):
        um.BatchedRegressionMLP(6, 50, torch.ones(1), 1.0, 1.0, hidden_layers=0)


def test_fused_kernels_refuse_two_hidden_layers_by_name():
    m = um.Members([{"dropout_rate": 0.05, "tau": 1.0}], torch.ones(1), 10)
    model, guide, _ = um.build("dropout", 6, 50, m, hidden_layers=2)
    assert not uci_fused.supports(model, guide)
    if uci_fused.available():  # without numba the reason is numba's
        assert "one hidden layer" in uci_fused.unsupported_reason(model, guide)
        x, y = torch.randn(1, 8, 6), torch.randn(1, 8)
        with pytest.raises(ValueError, match=r"\(one hidden layer\), not 2 hidden layers"):
            um.train(model, guide, x, y, 1, 1, batch_size=8, kernels=True, max_steps=1)


def test_one_layer_settings_keep_their_keys(data_dir):
    """The settings of a one-layer unit are those of the units written before the option (no
    ``hidden_layers`` key), so they still resume; a deeper unit's record the depth."""
    args = _parser().parse_args(["--data-dir", str(data_dir), "--out", "x", "--quick"])
    ds = load_uci("yacht", data_dir)
    assert "hidden_layers" not in protocol(ds, "dropout", args)
    args.hidden_layers = 2
    assert protocol(ds, "dropout", args)["hidden_layers"] == 2


def test_two_layer_runs_default_to_their_own_folder(data_dir):
    parser = _parser()
    base = ["--data-dir", str(data_dir), "--datasets", "yacht", "--splits", "0"]
    args = parser.parse_args(base + ["--hidden-layers", "2"])
    _resolve(args, parser)
    assert args.out == Path("uci-results-2layer")
    with pytest.raises(SystemExit):  # one layer: --out stays required
        _resolve(parser.parse_args(base), parser)
    with pytest.raises(SystemExit):
        _resolve(parser.parse_args(base + ["--out", "x", "--hidden-layers", "0"]), parser)


def test_quick_two_layer_run_writes_two_layer_units(two_layer_run):
    out, _, summary = two_layer_run
    for guide in ("dropout", "concrete"):
        unit = json.loads((out / "units" / "yacht" / guide / "split_0.json").read_text())
        assert unit["status"] == "done"
        assert unit["settings"]["hidden_layers"] == 2
        assert unit["final_fit"]["network"] == YACHT_NET
        # the fused kernels are written for one hidden layer: the compiled Pyro ELBO trains it
        assert unit["final_fit"]["engine"] == "traced"
        row = summary["datasets"]["yacht"]["guides"][guide]
        assert row["hidden_layers"] == 2 and row["engines"] == ["traced"]
    dropout = json.loads((out / "units" / "yacht" / "dropout" / "split_0.json").read_text())
    assert dropout["validation"]["phase"]["network"] == YACHT_NET
    assert dropout["validation"]["phase"]["engine"] == "traced"
    concrete = json.loads((out / "units" / "yacht" / "concrete" / "split_0.json").read_text())
    assert set(concrete["learned_dropout_rates"]) == {f"layers.{i}.weight" for i in range(3)}


def test_report_compares_two_layer_rows_with_gal_2016_two_layer(two_layer_run):
    out, _, summary = two_layer_run
    md = (out / "results.md").read_text()
    assert "Dropout'16 2-layer" in md and "‡ = two hidden layers" in md
    pub = PUBLISHED_TWO_LAYER["yacht"]
    drop = summary["datasets"]["yacht"]["guides"]["dropout"]
    targets = md.split("## Targets")[1].split("##")[0]
    (line,) = [ln for ln in targets.split("\n") if ln.startswith("| yacht")]
    assert line.startswith("| yacht ‡ |")
    diff = drop["rmse"]["mean"] - pub["rmse"][0]  # against 0.6565, not the anchor's 0.6663
    assert f"{diff:+.3g}" in line.split("|")[2]
    ll_diff = drop["ll"]["mean"] - pub["ll"][0]
    assert f"{ll_diff:+.3g}" in line.split("|")[3]
    calibration = md.split("### RMSE against LL")[1].split("###")[0]
    assert f"| {pub['rmse'][0]:.4g} | {pub['ll'][0]:.4g} |" in calibration
    concrete = md.split("### Concrete dropout against the anchor")[1]
    conc = summary["datasets"]["yacht"]["guides"]["concrete"]
    assert re.search(
        rf"\| yacht † ‡ \| concrete \| [✅❌] {conc['ll']['mean'] - pub['ll'][0]:+.3g}", concrete
    )


def test_resume_never_mixes_depths(data_dir, two_layer_run, tmp_path):
    """A one-layer folder resumed with --hidden-layers 2 refuses its units (and the other way
    round); the two-layer folder resumes its own units."""
    out2, argv2, _ = two_layer_run
    one = tmp_path / "one"
    argv1 = _argv(data_dir, one) + ["--epochs", "2"]
    uci.main(argv1)
    unit = one / "units" / "yacht" / "dropout" / "split_0.json"
    before = unit.read_text()
    with pytest.raises(RuntimeError, match=r"hidden_layers: None -> 2"):
        uci.main(argv1 + ["--resume", "--hidden-layers", "2"])
    assert unit.read_text() == before  # not reused, not overwritten
    copy = tmp_path / "two"
    shutil.copytree(out2, copy)
    argv = [a if a != str(out2) else str(copy) for a in argv2]
    units = sorted((copy / "units").rglob("*.json"))
    mtimes = [p.stat().st_mtime_ns for p in units]
    uci.main(argv + ["--resume"])  # the same depth: every unit reused
    assert [p.stat().st_mtime_ns for p in units] == mtimes
    one_layer = [a for a in argv if a not in ("--hidden-layers", "2")]
    with pytest.raises(RuntimeError, match=r"hidden_layers: 2 -> None"):
        uci.main(one_layer + ["--resume"])


def test_estimate_projects_two_hidden_layers(data_dir, tmp_path):
    argv = _argv(data_dir, tmp_path) + ["--hidden-layers", "2", "--estimate"]
    (row,) = uci.main(argv)
    assert row["settings"]["hidden_layers"] == 2
    for phase in ("validation", "final"):
        (chunk,) = row["phases"][phase]
        assert chunk["engine"] == "traced"
        assert chunk["units_per_pass"] == sum(YACHT_NET)  # inputs, both hidden layers, output
        assert chunk["seconds_per_step"] > 0
    assert row["projected_s"] > 0
    assert "| yacht | dropout | 1 |" in (tmp_path / "projection.md").read_text()


def test_a_merged_two_layer_row_sits_beside_the_one_layer_row(data_dir, two_layer_run, tmp_path):
    """Merging a two-layer summary keeps the one-layer row of the same guide (at 36cabe0 the
    two-layer yacht row replaced the one-layer one in the page's dropout column), both
    recompute from their own units, and the table shows a column per depth."""
    out2, _, summary2 = two_layer_run
    one = tmp_path / "one"
    uci.main(_argv(data_dir, one) + ["--epochs", "2"])
    merged = uci.main(
        _argv(data_dir, tmp_path / "page")
        + ["--report-only", "--merge", str(one / "summary.json")]
        + ["--merge", str(out2 / "summary.json")]
    )
    rows = merged["datasets"]["yacht"]["guides"]
    assert {"dropout", "dropout (2 layers)"} <= set(rows)
    one_row = json.loads((one / "summary.json").read_text())["datasets"]["yacht"]["guides"]
    assert rows["dropout"]["ll"] == one_row["dropout"]["ll"]
    assert (
        rows["dropout (2 layers)"]["ll"] == summary2["datasets"]["yacht"]["guides"]["dropout"]["ll"]
    )
    md = (tmp_path / "page" / "results.md").read_text()
    header = [ln for ln in md.split("\n") if ln.startswith("| dataset | ours: dropout")][0]
    assert "ours: dropout | ours: dropout (2 layers)" in header
    repro = md.split("Two hidden layers: MC dropout against")[1]
    pub, ll = PUBLISHED_TWO_LAYER["yacht"]["ll"], rows["dropout (2 layers)"]["ll"]["mean"]
    assert f"{ll - pub[0]:+.3g}" in repro.split("| yacht")[1].split("\n")[0]
    assert re.search(r"\*\*[01] of 1\*\* shown \(target: 7 of 9\)", repro)
    problems = uci.cli.page_row_problems(
        merged,
        {
            ("yacht", "dropout"): one,
            ("yacht", "dropout (2 layers)"): out2,
            ("yacht", "concrete (2 layers)"): out2,
        },
        [d for d in _resolve_yacht(data_dir)],
    )
    assert not [p for p in problems if "differs" in p or "no unit files" in p], problems


def _resolve_yacht(data_dir):
    args = _parser().parse_args(_argv(data_dir, "unused"))
    datasets, _ = _resolve(args, _parser())
    return datasets

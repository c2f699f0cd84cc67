"""The reference benchmark is a script; this checks that its --quick mode runs every problem
with the NUTS reference and every guide in one table, and records what it could not do."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import reference

UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


def test_quick_mode_writes_json_and_markdown(tmp_path):
    if not (UCI_DIR / reference.UCI_PROBLEM / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    out, md = tmp_path / "reference.json", tmp_path / "reference.md"
    argv = ["--quick", "--data-dir", str(UCI_DIR), "--json", str(out), "--markdown", str(md)]
    argv += ["--steps", "5", "--max-tree-depth", "3"]
    results = reference.main(argv)
    saved = json.loads(out.read_text())
    assert saved["meta"]["quick"] and saved["meta"]["total_wall_s"] > 0
    assert len(saved["meta"]["code"]["commit"]) == 40  # which code produced the page
    assert all(r["wall_s"] > 0 for r in saved["results"])
    settings = saved["meta"]["settings"]
    assert settings["steps"] == 5 and settings["nuts"]["max_tree_depth"] == 3
    assert settings["nuts"]["num_chains"] == reference.SETTINGS["quick"]["nuts"]["num_chains"]
    assert [r["problem"] for r in saved["results"]] == list(reference.PROBLEMS)
    expected = {"NUTS (reference)", *reference.guides(), "Deep ensemble (2 MAP)"}
    for res in results:
        fits = {row["fit"] for row in res["rows"]}
        assert fits | set(res["failed"]) == expected  # every fit: a row or a reason
        rows = {row["fit"]: row for row in res["rows"]}
        ref_row = rows["NUTS (reference)"]
        score = "ref_tv" if res["task"] == "classification" else "ref_w1"
        assert ref_row[score] == 0.0  # the reference against itself
        assert all(row["wall_s"] > 0 for row in res["rows"])
        assert math.isnan(ref_row["vi_khat"]) and "no density" in ref_row["vi_diagnosis"]
        assert res["reference"]["fn_rhat_max"] > 0
        assert res["reference"]["init_from"] == "AutoMeanField"  # chains start from its draws
        if res["problem"] == "gap1d":  # 1-D: predictive bands of every fit in the table
            bands = res["bands"]
            assert set(bands["fits"]) == fits
            for q in bands["fits"].values():
                assert len(q) == len(reference.BAND_QUANTILES)
                assert all(len(row) == len(bands["x_test"]) for row in q)
                assert np.all(np.diff(np.asarray(q), axis=0) >= 0)  # quantiles in order
        else:
            assert res["bands"] is None
    text = md.read_text()
    assert "### gap1d (regression" in text and "| NUTS (reference) |" in text
    assert "### iris (classification" in text and "ref_agreement" in text

    # The page re-rendered from the JSON alone, training nothing.
    page = tmp_path / "page.md"
    again = reference.main(["--report-only", "--json", str(out), "--page", str(page)])
    assert [r["problem"] for r in again] == list(reference.PROBLEMS)
    text = page.read_text()
    assert text.startswith("# Closest to the posterior") and "--quick" in text
    assert str(tmp_path) not in text and "--json reference.json" in text  # no machine paths
    assert "## Do the cheap diagnostics rank the fits like the reference?" in text
    assert all(f"| {p} | " in text for p in reference.PROBLEMS)


def test_report_only_needs_a_json(tmp_path, capsys):
    with pytest.raises(SystemExit):
        reference.main(["--report-only", "--json", str(tmp_path / "missing.json")])
    assert "--report-only needs --json" in capsys.readouterr().err


def _result(task, rows):
    fid = "ref_tv" if task == "classification" else "ref_w1"
    keys = ("elpd_loo", "test_lpd", "vi_khat", fid)
    return {
        "problem": "p",
        "task": task,
        "rows": [{"fit": reference.REFERENCE, **dict.fromkeys(keys, 0.0)}]
        + [{"fit": name, **dict(zip(keys, vals, strict=True))} for name, vals in rows],
    }


def test_rank_agreement_by_hand():
    # elpd_loo orders the fits as the reference does, test_lpd reverses it, and k̂ (lower
    # is better; inf ranks last, NaN is left out) agrees on the three finite values
    res = _result(
        "regression",
        [
            ("a", (-10.0, -3.0, 0.5, 0.1)),
            ("b", (-20.0, -2.0, 0.8, 0.2)),
            ("c", (-30.0, -1.0, math.inf, 0.3)),
            ("d", (-40.0, 0.0, math.nan, 0.4)),
        ],
    )
    (row,) = reference.rank_agreement([res])
    assert row["fits"] == 4 and row["closest"] == "a" and row["fidelity"] == "ref_w1"
    assert row["elpd_loo"] == pytest.approx(1.0)
    assert row["test_lpd"] == pytest.approx(-1.0)
    assert row["vi_khat"] == pytest.approx(1.0)  # a, b, c in order; d (NaN) left out
    cls = _result("classification", [("x", (1.0, 1.0, 1.0, 0.3)), ("y", (2.0, 2.0, 2.0, 0.1))])
    (row,) = reference.rank_agreement([cls])
    assert row["closest"] == "y" and row["fidelity"] == "ref_tv"
    assert math.isnan(row["elpd_loo"])  # two fits: no correlation


def test_unknown_problem_is_reported(capsys):
    with pytest.raises(SystemExit):
        reference.main(["--quick", "--problems", "gap1d,mnist"])
    err = capsys.readouterr().err
    assert "unknown problem 'mnist'" in err and "yacht" in err  # every UCI set is a problem
    with pytest.raises(ValueError, match="unknown problem 'mnist'"):
        reference.load_problem("mnist", reference.SETTINGS["quick"], 0, UCI_DIR)


@pytest.mark.parametrize("name", ["yacht", "bostonHousing"])
def test_any_uci_set_is_a_problem(name):
    # the same protocol as the default UCI problem: split 0, standardised, rows subsampled
    cfg = reference.SETTINGS["quick"]
    model, x, y, xt, yt = reference.load_problem(name, cfg, 0, UCI_DIR)
    assert x.shape[0] == y.shape[0] == cfg["max_train"]
    assert xt.shape[0] == yt.shape[0] == cfg["max_test"]
    assert x.shape[1] == xt.shape[1] == model.net.layers[0].in_features
    assert abs(float(x.mean())) < 1.0 and y.dtype == x.dtype  # standardised floats

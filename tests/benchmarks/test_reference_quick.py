"""The reference benchmark is a script; this checks that its --quick mode runs every problem
with the NUTS reference and every guide in one table, and records what it could not do."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pyro_dropout.benchmarks import reference

UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


def test_quick_mode_writes_json_and_markdown(tmp_path):
    if not (UCI_DIR / "yacht" / "data.txt").is_file():
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


def test_unknown_problem_is_reported(capsys):
    with pytest.raises(SystemExit):
        reference.main(["--quick", "--problems", "gap1d,mnist"])
    assert "unknown problem 'mnist'" in capsys.readouterr().err

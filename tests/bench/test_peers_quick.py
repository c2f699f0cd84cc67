"""The peers benchmark is a script; its --quick mode runs our side everywhere and each peer
only where it is installed (CI does not install them: they are skipped with the reason)."""

import json
import math
from pathlib import Path

import pytest

from benchmarks import peers

UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"
OURS = list(peers.GUIDES)


def _need_data():
    if not (UCI_DIR / "yacht" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")


def _quick(tmp_path, methods):
    argv = ["--quick", "--data-dir", str(UCI_DIR), "--out", str(tmp_path)]
    return peers.main([*argv, "--methods", ",".join(methods)])


@pytest.mark.usefixtures("one_thread")
def test_quick_mode_runs_our_side_and_writes_the_page(tmp_path):
    _need_data()
    methods = [*OURS, "plain MC dropout"]
    report = _quick(tmp_path, methods)
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved["meta"]["quick"] and len(saved["meta"]["code"]["commit"]) == 40
    (res,) = saved["uci"]
    assert res["dataset"] == "yacht" and [r["method"] for r in res["rows"]] == methods
    for row in res["rows"]:
        assert "error" not in row, row
        assert math.isfinite(row["ll"]) and row["rmse"] > 0 and 0 < row["n_test"] <= 32
        assert ("ll_diff" in row) == (row["method"] != peers.REFERENCE)  # paired vs AutoDropout
    steps = saved["steps"]["W1"]
    assert set(steps["ratio"]) == set(OURS) and all(v > 0 for v in steps["ratio"].values())
    assert steps["median_ms"][peers.BASELINE] > 0
    # user code is counted from the adapters' marked blocks
    assert report["user_lines"]["ours (any guide)"] < report["user_lines"]["plain MC dropout"]
    text = (tmp_path / "peers.md").read_text()
    assert text.startswith("# Side by side with the peers") and "--quick" in text
    assert str(tmp_path) not in text  # no machine paths in the page
    assert "| AutoDropout | " in text and "### Lines of user code" in text

    # the page again from the JSON alone
    (tmp_path / "peers.md").unlink()
    again = peers.main(["--report-only", "--out", str(tmp_path)])
    assert again["uci"] == saved["uci"] and (tmp_path / "peers.md").read_text() == text


@pytest.mark.parametrize(
    ("module", "methods"),
    [
        ("tyxe", ["TyXe"]),
        ("bayesian_torch", ["bayesian-torch (recipe)", "bayesian-torch (KL summed)"]),
        ("laplace", ["laplace-torch"]),
    ],
)
@pytest.mark.usefixtures("one_thread")
def test_quick_mode_runs_an_installed_peer(tmp_path, module, methods):
    pytest.importorskip(module, reason=f"{module} is a peer, not a dependency (see peers.md)")
    _need_data()
    report = _quick(tmp_path, [peers.REFERENCE, *methods])
    rows = {r["method"]: r for r in report["uci"][0]["rows"]}
    for m in methods:
        assert "error" not in rows[m], rows[m]
        assert math.isfinite(rows[m]["ll"]) and math.isfinite(rows[m]["ll_diff"])
        if m != "laplace-torch":  # no training step of its own
            assert report["steps"]["W1"]["ratio"][m] > 0


def test_a_missing_peer_is_recorded_not_fatal(monkeypatch):
    monkeypatch.setattr(peers, "_import_errors", lambda: {"TyXe": "ModuleNotFoundError: x"})
    keep, missing = peers._available(["AutoDropout", "TyXe"])
    assert keep == ["AutoDropout"] and missing == {"TyXe": "ModuleNotFoundError: x"}


def test_report_only_needs_the_json(tmp_path, capsys):
    with pytest.raises(SystemExit):
        peers.main(["--report-only", "--out", str(tmp_path)])
    assert "--report-only needs" in capsys.readouterr().err

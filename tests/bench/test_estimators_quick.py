"""The estimator benchmark is a script; this only checks that its --quick mode runs and reports
every (workload, guide, estimator) with a positive variance ratio and step time."""

import json

from benchmarks import estimators


def test_quick_mode_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "estimators.json", tmp_path / "estimators.md"
    results = estimators.main(["--quick", "--json", str(out), "--markdown", str(md)])
    saved = json.loads(out.read_text())["results"]
    assert len(json.loads(out.read_text())["meta"]["code"]["commit"]) == 40
    assert len(saved) == len(results) == len(estimators.WORKLOADS) * len(estimators.GUIDES)
    for row in saved:
        expected = {e for e in estimators.ESTIMATORS if estimators.applies(row["guide"], e)}
        assert set(row["variance"]) == set(row["step_ms"]) == expected
        assert all(v > 0 for v in row["variance"].values())
        assert all(t > 0 for t in row["step_ms"].values())
    text = md.read_text()
    assert "| LeNet 16x16 | AutoDropout | per_example |" in text
    assert "| LeNet 16x16 | AutoDropout | flipout | n/a" in text

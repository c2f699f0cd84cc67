"""The speed benchmark is a script; this only checks that its --quick mode runs and reports."""

import json

from pyro_dropout.benchmarks import speed


def test_quick_mode_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "speed.json", tmp_path / "speed.md"
    report = speed.main(["--quick", "--rounds", "1", "--json", str(out), "--markdown", str(md)])
    saved = json.loads(out.read_text())
    assert len(saved["code"]["commit"]) == 40  # which code produced the numbers
    assert set(saved["results"]) == {"W1", "W2"}
    for w in ("W1", "W2"):
        ratios = report["results"][w]["ratios"]
        guides = ("AutoDropout", "AutoMeanField", "AutoVariationalDropout")
        expected = {g + s for g in guides for s in ("", speed.JIT_SUFFIX)}
        expected |= {"predict", "predict" + speed.WEIGHTS_SUFFIX}
        assert set(ratios) == expected
        assert all(r > 0 for r in ratios.values())
    text = md.read_text()
    assert "AutoDropout + LRT, training step (eager)" in text
    assert "AutoDropout + LRT, training step (JIT)" in text

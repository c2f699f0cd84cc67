"""The scale benchmark is a script; this checks its --quick mode and its streamed data set."""

import json

import pytest
import torch

pytest.importorskip("lightning")

from benchmarks import scale  # noqa: E402


def test_stream_is_deterministic_and_sharded():
    ds = scale.StreamedRegression(rows=2500, batch=1000, seed=3)
    a, b = list(ds), list(ds)
    assert [x.shape[0] for x, _ in a] == [1000, 1000, 500]
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # the same rows every pass
    assert not torch.equal(a[0][0], a[1][0])
    assert ds.num_data == 2500


# Lightning warns from its own code on every fit (see tests/lightning/test_trainer.py), and
# about a loader without worker processes, which is what a smoke test wants.
@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")
@pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")
def test_quick_mode_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "scale.json", tmp_path / "scale.md"
    report = scale.main(["--quick", "--json", str(out), "--markdown", str(md)])
    saved = json.loads(out.read_text())
    assert len(saved["code"]["commit"]) == 40  # which code produced the numbers
    assert [r["config"] for r in saved["results"]] == ["fit", "trainer-1"]
    for r in report["results"]:
        assert r["examples_per_s"] > 0 and r["ratio_to_plain"] > 0
        assert r["rows_trained"] == 4096
    assert "| trainer-1 | 1 |" in md.read_text()

"""The code on the "Scaling out" page runs as written (with a smaller budget)."""

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="needs the lightning extra: pip install -e '.[lightning]'")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "scaling-out.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated")
@pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")
def test_scaling_out_page_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the page's Trainer writes its default checkpoints/ here
    fit_block, module_block = _blocks()[:2]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, generator=g)
    y = x.sum(-1) + 0.1 * torch.randn(300, generator=g)
    namespace = {"x": x, "y": y, "x_test": x[:20]}
    exec(fit_block.replace("num_epochs=20", "num_epochs=2"), namespace)  # noqa: S102
    assert len(namespace["losses"]) == 2 * 2  # two epochs of ceil(300 / 256) steps
    code = module_block.replace("max_epochs=20", "max_epochs=2").replace(
        "logger=False)", "logger=False, enable_progress_bar=False, enable_model_summary=False)"
    )
    exec(code, namespace)  # noqa: S102 - the page's own code
    assert namespace["trainer"].global_step == 2 * (300 // 128)
    assert namespace["pred"].samples.shape[1] == 20
    assert list(tmp_path.glob("checkpoints/*.ckpt"))  # Lightning's default ModelCheckpoint

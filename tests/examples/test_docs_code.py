"""The code on the "Bring your own model" page runs as written (with a smaller budget)."""

from __future__ import annotations

import re
from pathlib import Path

import pyro
import pytest

from pyro_dropout.infer.draws import VectorizationWarning

PAGE = Path(__file__).resolve().parents[2] / "docs" / "your-own-model.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def test_your_own_model_page_runs():
    code = "\n".join(_blocks()[:2])
    code = code.replace("num_epochs=2000", "num_epochs=30").replace(
        "num_samples=200", "num_samples=30"
    )
    pyro.set_rng_seed(0)
    namespace: dict = {}
    # the page's model does not broadcast over the draws: predict and compare say so, once each
    with pytest.warns(VectorizationWarning, match="does not broadcast over a leading draw") as w:
        exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    fallbacks = [r for r in w if issubclass(r.category, VectorizationWarning)]
    assert len(fallbacks) == 2 and {r.filename for r in fallbacks} == {str(PAGE)}
    assert "Trace Shapes" not in str(fallbacks[0].message)  # Pyro's shape table, cut off
    pred, table = namespace["pred"], namespace["table"]
    assert pred.samples.shape == (30, 200) and pred.log_likelihood(namespace["y"]).shape == (200,)
    assert sorted(table.index) == ["bbb", "mc_dropout", "vd"]
    assert set(namespace["guides"]["bbb"].median()) >= {"layer1.weight", "sigma"}

"""``tools/uci_hetero_diagnosis.py``: its re-run repeats the units it reads (the numbers it puts
beside theirs are the same fits), and its per-member report says which rows a member leaves
far off and what noise it predicts there."""

import math
import re

import pytest
import torch

from benchmarks import uci, uci_model
from pyro_dropout.infer import CompiledSVI

from ._uci import load_tool, yacht_argv

pytestmark = pytest.mark.usefixtures("one_thread")


def _tool():
    return load_tool("uci_hetero_diagnosis.py")


def test_the_rerun_repeats_the_units_test_rmse(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    uci.main(yacht_argv(data_dir, out, "vd-hetero"))
    capsys.readouterr()
    originals = (CompiledSVI.step, uci_model.evaluate)
    _tool().main(
        [
            "--data-dir",
            str(data_dir),
            "--units",
            str(out / "units"),
            "--dataset",
            "yacht",
            "--guide",
            "vd-hetero",
            "--splits",
            "0",
            "1",
            "--save",
            str(tmp_path / "params.pt"),
        ]
    )
    assert (CompiledSVI.step, uci_model.evaluate) == originals  # nothing left patched
    text = capsys.readouterr().out
    assert "note:" not in text  # the units' batch
    got, units = re.search(r"test RMSE \[(.*)\] \(units: \[(.*)\]\)", text).groups()
    assert [float(v) for v in got.split(",")] == [float(v) for v in units.split(",")]
    assert re.search(r"split 0: .*rows > 5 SD off", text) and re.search(r"split 1: ", text)
    assert (tmp_path / "params.pt").is_file()


def test_the_report_names_the_rows_a_member_leaves_far_off(capsys):
    """Two members on eight rows with y = 0: member 0 predicts 0 everywhere (no row off),
    member 1 predicts 10 k on row k (every row more than 5 off) with a predicted SD that grows
    with its error."""
    k = torch.arange(1.0, 9.0)
    mean = torch.stack([torch.zeros(8), 10.0 * k])
    sd = torch.stack([torch.full((8,), 0.1), 0.5 * k])
    _tool()._member_report(mean, sd, torch.zeros(2, 8), [3, 7])
    member0, member1 = capsys.readouterr().out.splitlines()
    assert member0.startswith("split 3:") and "rows > 5 SD off 0.000" in member0
    assert "RMSE 0.00" in member0
    assert member1.startswith("split 7:") and "rows > 5 SD off 1.000" in member1
    rmse = math.sqrt(sum((10.0 * j) ** 2 for j in range(1, 9)) / 8)
    assert (
        f"RMSE {rmse:.2f}" in member1 and "noise SD there, median 2.00" in member1
    )  # (torch: the lower middle)
    corr = float(re.search(r"corr\(log error, log SD\) ([-\d.]+)", member1).group(1))
    assert corr > 0.99  # the error and the predicted SD both grow with k

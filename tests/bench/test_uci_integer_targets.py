"""``tools/uci_integer_targets.py``: its re-run repeats the units' density LL, and its
discretised score is the probability of the unit bin around each target under the predictive
mixture (checked against the normal CDF written out with ``math.erf``)."""

import math
import re

import pytest
import torch

from benchmarks import uci, uci_fused, uci_model
from benchmarks.uci_model import evaluation

from ._uci import load_tool, yacht_argv

pytestmark = pytest.mark.usefixtures("one_thread")


def _tool():
    return load_tool("uci_integer_targets.py")


@pytest.mark.parametrize("guide", ["dropout", "vd-hetero"])
def test_the_rerun_repeats_the_units_density_ll(data_dir, tmp_path, capsys, guide):
    out = tmp_path / "out"
    uci.main(yacht_argv(data_dir, out, guide))
    capsys.readouterr()
    originals = (evaluation._Draw.__call__, uci_fused.FusedDraw.__call__, uci_model.evaluate)
    argv = ["--data-dir", str(data_dir), "--units", str(out / "units"), "--dataset", "yacht"]
    _tool().main([*argv, "--guide", guide, "--splits", "0", "1"])
    assert (
        evaluation._Draw.__call__,
        uci_fused.FusedDraw.__call__,
        uci_model.evaluate,
    ) == originals  # nothing left patched
    text = capsys.readouterr().out
    assert "note:" not in text  # the units' batch
    rows = re.findall(
        r"split (\d): density LL (\S+) \(evaluate (\S+), unit (\S+)\); discretised LL ([-\d.]+)",
        text,
    )
    assert [r[0] for r in rows] == ["0", "1"]
    for _, density, evaluated, unit, discrete in rows:
        # the recorded passes give evaluate's LL (float64 sums in another order: 1e-4) ...
        assert abs(float(density) - float(evaluated)) < 1e-4
        assert float(evaluated) == pytest.approx(float(unit), abs=1e-4)  # ... and the unit's
        assert float(discrete) <= 0.0  # a probability


def _bin_mass(y, f, s):
    phi = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
    return phi((y + 0.5 - f) / s) - phi((y - 0.5 - f) / s)


def test_the_scores_are_the_mixtures_density_and_bin_mass():
    g = torch.Generator().manual_seed(3)
    t, m, n = 7, 2, 5
    outs = torch.randn(t, m, n, 2, generator=g, dtype=torch.float64)
    outs[..., 1] = outs[..., 1].abs() + 0.05  # standardised noise SDs, some far below a bin
    y = torch.randint(3, 9, (m, n), generator=g).double()
    y_mean, y_std = torch.tensor([5.6, 5.2]), torch.tensor([0.8, 1.3])
    density, discrete, _ = _tool().integer_scores(outs, y, y_mean, y_std, None, True)
    for i in range(m):
        dens, disc = [], []
        for j in range(n):
            f = [float(outs[k, i, j, 0] * y_std[i] + y_mean[i]) for k in range(t)]
            s = [float(outs[k, i, j, 1] * y_std[i]) for k in range(t)]
            yy = float(y[i, j])
            pdf = [
                math.exp(-0.5 * ((yy - a) / b) ** 2) / (b * math.sqrt(2 * math.pi))
                for a, b in zip(f, s, strict=True)
            ]
            dens.append(math.log(sum(pdf) / t))
            disc.append(math.log(sum(_bin_mass(yy, a, b) for a, b in zip(f, s, strict=True)) / t))
        assert float(density[i]) == pytest.approx(sum(dens) / n, rel=1e-9)
        assert float(discrete[i]) == pytest.approx(sum(disc) / n, rel=1e-9)
    # homoscedastic: every pass has the SD tau^-1/2; a wide predictive scores alike both ways
    wide = torch.zeros(t, m, n, dtype=torch.float64)
    tau = torch.tensor([1e-4, 1e-4])
    density, discrete, noise = _tool().integer_scores(wide, y, y_mean, y_std, tau, False)
    assert torch.allclose(noise, torch.full((m,), 100.0, dtype=torch.float64))
    assert torch.allclose(density, discrete, atol=1e-6)

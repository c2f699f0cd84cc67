"""The README's first command, ``python -m pyro_dropout.demo``, run small."""

from __future__ import annotations

import pytest
import torch

from pyro_dropout import BayesianMLP
from pyro_dropout.demo import TABLE_COLUMNS, build_guides, main, parse_args

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_main_writes_a_png_and_returns_a_three_row_table(tmp_path, capsys):
    pytest.importorskip(
        "statsmodels", reason="needs the examples extra: pip install -e '.[examples]'"
    )  # the CO2 series ships with statsmodels
    import matplotlib.image as mpimg

    out = tmp_path / "demo.png"
    table, path = main(["--steps", "30", "--output", str(out), "--samples", "60"])

    assert path == out and out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    image = mpimg.imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas

    assert len(table) == 3
    assert set(table.index) == {"mc_dropout", "mean_field", "variational_dropout"}
    assert set(TABLE_COLUMNS) <= set(table.columns)
    assert table["test_rmse"].notna().all() and table["elpd_loo"].notna().all()
    printed = capsys.readouterr().out
    assert "elpd_loo" in printed and "mc_dropout" in printed and str(out.resolve()) in printed
    # after 30 steps no guide is near the posterior: the VI k-hat is flagged where printed,
    # with what it means and what to use instead
    assert (table["vi_khat"] >= 0.7).all()
    assert "VI k-hat >= 0.7" in printed and "held-out scores" in printed
    lines = printed.splitlines()
    header = next(line.split() for line in lines if "vi_khat" in line.split())
    rows = [line.split() for line in lines if line.startswith(tuple(table.index))]
    assert len(rows) == 3 and all(row[1 + header.index("vi_khat")].endswith("!") for row in rows)


def test_main_leaves_the_thread_count_as_it_found_it(tmp_path):
    pytest.importorskip(
        "statsmodels", reason="needs the examples extra: pip install -e '.[examples]'"
    )
    before = torch.get_num_threads()
    main(["--steps", "2", "--samples", "30", "--hidden", "8", "--output", str(tmp_path / "a.png")])
    assert torch.get_num_threads() == before


def test_main_trains_the_compiled_loss(tmp_path, monkeypatch):
    # The compiled loss halves the demo's CPU time (about 40 s instead of 62 s on 2 cores).
    pytest.importorskip(
        "statsmodels", reason="needs the examples extra: pip install -e '.[examples]'"
    )
    import pyro_dropout.demo as demo

    calls, real_fit = [], demo.fit

    def spy(*args, **kwargs):
        calls.append(kwargs.get("jit", "auto"))  # fit compiles by default
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(demo, "fit", spy)
    main(["--steps", "2", "--samples", "30", "--hidden", "8", "--output", str(tmp_path / "a.png")])
    assert calls == ["auto"] * 3


def test_parse_args_defaults_and_options():
    args = parse_args([])
    assert args.hidden == (100, 100) and args.activation == "relu" and args.steps >= 1000
    assert str(args.output) == "pyro_dropout_demo.png"
    args = parse_args(["--hidden", "50,20", "--activation", "tanh", "--seed", "3"])
    assert args.hidden == (50, 20) and args.activation == "tanh" and args.seed == 3


@pytest.mark.parametrize(
    "argv",
    [["--hidden", "a,b"], ["--hidden", "0"], ["--activation", "sigmoid"], ["--steps", "0"]],
)
def test_parse_args_rejects_bad_options(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_guides_share_the_model_and_the_input_is_not_dropped():
    model = BayesianMLP(1, 1, hidden=(6, 6), tau=100.0)
    guides = build_guides(model, dropout_rate=0.2)
    assert list(guides) == ["mc_dropout", "mean_field", "variational_dropout"]
    x, y = torch.randn(16, 1), torch.randn(16)
    for guide in guides.values():
        guide(x, y)  # set up the parameters
    dropout = guides["mc_dropout"]
    assert dropout.config["dropout_rate"] == {
        "net.layers.0.weight": 0.0,
        "net.layers.1.weight": 0.2,
        "net.layers.2.weight": 0.2,
    }
    # weight averaging (standard dropout at test time) uses E[W] = (1 - p) M per layer
    means = dropout.median()
    locs = {name: dropout._get("locs", name) for name in means}
    torch.testing.assert_close(means["net.layers.0.weight"], locs["net.layers.0.weight"])
    torch.testing.assert_close(means["net.layers.1.weight"], 0.8 * locs["net.layers.1.weight"])

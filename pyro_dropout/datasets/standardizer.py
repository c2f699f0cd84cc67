"""Column-wise standardisation fitted on training rows only.

The UCI protocol (and most regression experiments in this package) standardises inputs
and targets with the mean and standard deviation of the rows used to fit the model, then
maps predictions back to the original target scale before computing any metric.
:class:`Standardizer` holds those statistics and applies the transform and its inverse
to NumPy arrays or torch tensors alike.

Example:
    >>> import numpy as np
    >>> from pyro_dropout.datasets import Standardizer
    >>> x = np.array([[1.0, 5.0], [3.0, 5.0]])  # second column is constant
    >>> y = np.array([10.0, 20.0])
    >>> s = Standardizer.fit(x, y)
    >>> s.transform_x(x)
    array([[-1.,  0.],
           [ 1.,  0.]])
    >>> s.inverse_y(s.transform_y(y))
    array([10., 20.])
"""

from __future__ import annotations

from typing import Literal, Self, TypeVar

import numpy as np
import torch

__all__ = ["Standardizer"]

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)
InverseKind = Literal["value", "mean", "std", "var"]


def _fit_column_stats(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population SD (ddof = 0) per column; constant columns get mean = value, SD 1.

    A column is treated as constant when all its values are exactly equal (max == min).
    This is more robust than testing ``std == 0``: for naval's column 11 the floating-point
    SD of a constant column comes out as 2.4e-13 rather than 0.
    """
    mean = a.mean(axis=0)
    std = a.std(axis=0)  # ddof = 0, as np.std in the reference code
    constant = a.max(axis=0) == a.min(axis=0)
    mean = np.where(constant, a[0], mean)
    # std can also underflow to 0 for (sub)normal-tiny but unequal values: use 1 there too.
    std = np.where(constant | ~(std > 0), 1.0, std)
    return mean, std


def _affine(
    a: ArrayT, shift: np.ndarray | float, scale: np.ndarray | float, inverse: bool
) -> ArrayT:
    """``(a - shift) / scale`` or its inverse ``a * scale + shift``, keeping the array type."""
    if isinstance(a, torch.Tensor):
        dtype = a.dtype if a.is_floating_point() else torch.get_default_dtype()
        shift_t = torch.as_tensor(shift, dtype=dtype, device=a.device)
        scale_t = torch.as_tensor(scale, dtype=dtype, device=a.device)
        a = a.to(dtype)
        return a * scale_t + shift_t if inverse else (a - shift_t) / scale_t
    a_np = np.asarray(a, dtype=np.float64)
    return a_np * scale + shift if inverse else (a_np - shift) / scale


class Standardizer:
    """Mean/SD standardisation of inputs ``x`` (per column) and a scalar target ``y``.

    Statistics use the population standard deviation (``ddof=0``, as ``np.std`` in the
    reference UCI code). Columns whose values are all identical get a standard deviation
    of 1 (and their own value as mean, so they transform to exactly 0); the same rule
    applies to ``y``. Transforms accept NumPy arrays (computed in float64) or torch
    tensors (computed in the tensor's floating dtype, on its device) and return the same
    kind.

    Args:
        x_mean: Per-column means of the inputs, shape ``(D,)``.
        x_std: Per-column standard deviations, shape ``(D,)``; must be positive.
        y_mean: Mean of the target.
        y_std: Standard deviation of the target; must be positive.

    Example:
        >>> import numpy as np
        >>> s = Standardizer.fit(np.arange(6.0).reshape(3, 2), np.array([1.0, 2.0, 3.0]))
        >>> s.x_mean, s.y_mean
        (array([2., 3.]), 2.0)
        >>> float(s.inverse_y(np.array(1.0), kind="var"))  # variance scales by sd**2
        0.6666666666666666
    """

    def __init__(
        self,
        x_mean: np.ndarray,
        x_std: np.ndarray,
        y_mean: float = 0.0,
        y_std: float = 1.0,
    ) -> None:
        self.x_mean = np.atleast_1d(np.asarray(x_mean, dtype=np.float64)).copy()
        self.x_std = np.atleast_1d(np.asarray(x_std, dtype=np.float64)).copy()
        if self.x_mean.shape != self.x_std.shape or self.x_mean.ndim != 1:
            raise ValueError(
                f"x_mean and x_std must be 1-D of equal length, got shapes "
                f"{self.x_mean.shape} and {self.x_std.shape}"
            )
        if not np.all(np.isfinite(self.x_std) & (self.x_std > 0)):
            raise ValueError("x_std must be finite and positive")
        self.y_mean = float(y_mean)
        self.y_std = float(y_std)
        if not (np.isfinite(self.y_std) and self.y_std > 0):
            raise ValueError(f"y_std must be finite and positive, got {y_std}")

    @classmethod
    def fit(cls, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor | None = None) -> Self:
        """Fit the statistics on training rows.

        Args:
            x: Training inputs, shape ``(N, D)`` (a 1-D array is treated as one column).
            y: Training targets, shape ``(N,)`` or ``(N, 1)``. If omitted the target
                transform is the identity (mean 0, SD 1).

        Returns:
            Standardizer: the fitted transform.

        Example:
            >>> import numpy as np
            >>> Standardizer.fit(np.array([[0.0], [2.0]])).x_std
            array([1.])
        """
        x_np = _as_numpy(x)
        if x_np.ndim == 1:
            x_np = x_np[:, None]
        if x_np.ndim != 2 or x_np.shape[0] == 0:
            raise ValueError(f"x must be a non-empty (N, D) array, got shape {x_np.shape}")
        x_mean, x_std = _fit_column_stats(x_np)
        if y is None:
            return cls(x_mean, x_std)
        y_np = _as_numpy(y).reshape(-1)
        if y_np.shape[0] != x_np.shape[0]:
            raise ValueError(f"x has {x_np.shape[0]} rows but y has {y_np.shape[0]} values")
        y_mean, y_std = _fit_column_stats(y_np[:, None])
        return cls(x_mean, x_std, float(y_mean[0]), float(y_std[0]))

    # ----------------------------------------------------------------------- inputs
    def transform_x(self, x: ArrayT) -> ArrayT:
        """Standardise inputs: ``(x - x_mean) / x_std`` (broadcast over the last axis)."""
        return _affine(x, self.x_mean, self.x_std, inverse=False)

    def inverse_x(self, x: ArrayT) -> ArrayT:
        """Map standardised inputs back: ``x * x_std + x_mean``."""
        return _affine(x, self.x_mean, self.x_std, inverse=True)

    # ---------------------------------------------------------------------- targets
    def transform_y(self, y: ArrayT) -> ArrayT:
        """Standardise targets: ``(y - y_mean) / y_std``."""
        return _affine(y, self.y_mean, self.y_std, inverse=False)

    def inverse_y(self, y: ArrayT, kind: InverseKind = "value") -> ArrayT:
        """Map standardised target quantities back to the original scale.

        Args:
            y: Quantity on the standardised scale (array or tensor, any shape).
            kind: What ``y`` is. ``"value"`` or ``"mean"`` (targets, samples, predictive
                means): ``y * y_std + y_mean``. ``"std"`` (a standard deviation or any
                scale): ``y * y_std``. ``"var"`` (a variance): ``y * y_std**2``.

        Returns:
            The quantity on the original target scale, same type as ``y``.

        Example:
            >>> import numpy as np
            >>> s = Standardizer(np.zeros(1), np.ones(1), y_mean=10.0, y_std=2.0)
            >>> s.inverse_y(np.array([0.0, 1.0])), s.inverse_y(np.array([1.0]), kind="std")
            (array([10., 12.]), array([2.]))
        """
        if kind in ("value", "mean"):
            return _affine(y, self.y_mean, self.y_std, inverse=True)
        if kind == "std":
            return _affine(y, 0.0, self.y_std, inverse=True)
        if kind == "var":
            return _affine(y, 0.0, self.y_std**2, inverse=True)
        raise ValueError(f"kind must be 'value', 'mean', 'std' or 'var', got {kind!r}")

    def __repr__(self) -> str:
        return (
            f"Standardizer(D={self.x_mean.shape[0]}, y_mean={self.y_mean:.6g}, "
            f"y_std={self.y_std:.6g})"
        )


def _as_numpy(a: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)

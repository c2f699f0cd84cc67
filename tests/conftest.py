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


@pytest.fixture(autouse=True, scope="module")
def _free_traced_graphs():
    """A traced loss (``JitMeanFieldELBO``, the UCI engine) is registered in TorchScript's global
    compilation unit and lives as long as the process (about 44 MB per compiled fit of a
    20-200-200-1 network): the suite grew to several GB per line. Nothing outside a test module
    calls its traces, and the unit holds nothing else here (empty after importing the library,
    Lightning, ArviZ, scikit-learn), so they are dropped after each module."""
    yield
    import gc

    import torch

    gc.collect()
    torch.jit._state._python_cu.drop_all_functions()

"""Fixtures for the local-reparameterisation and ELBO-estimator tests."""

import pyro
import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    """Empty param store, fixed seed and argument validation on, for every test here."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    pyro.enable_validation(True)
    yield
    pyro.clear_param_store()


@pytest.fixture(autouse=True)
def _single_thread():
    """One intra-op thread: these tests run thousands of tiny ops, for which torch's thread
    pool only adds overhead; on a busy 2-core runner it doubled the wall time (50 s vs 24 s)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

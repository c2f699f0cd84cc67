"""Shared fixtures and helpers for the probability-layer tests."""

import pyro
import pytest

from pyro_dropout.distributions import kl as pd_kl


@pytest.fixture(autouse=True, scope="module")
def _validation_on():
    """Argument validation on for every test here (Pyro can toggle torch's global default).

    Module-scoped so that ``hypothesis`` tests do not trip its function-scoped-fixture check.
    """
    pyro.enable_validation(True)
    yield


@pytest.fixture
def restore_log_uniform_kl():
    """Restore the module-level choice of ``set_log_uniform_kl`` after a test that switches it."""
    previous = pd_kl._approximation
    try:
        yield
    finally:
        pd_kl.set_log_uniform_kl(previous)


@pytest.fixture
def param_store():
    pyro.clear_param_store()
    yield pyro.get_param_store()
    pyro.clear_param_store()

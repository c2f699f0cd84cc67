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
    """Pyro's own JIT (``pyro.ops.jit.trace``, e.g. the NUTS reference's ``jit_compile``)
    registers each trace in TorchScript's global compilation unit for the life of the process.
    The library's compiled losses do not (``pyro_dropout.infer.traced``; tested in
    ``tests/infer/test_compiled_default.py``); the rest is dropped after each module. The unit
    holds nothing else here (empty after importing the library, Lightning, ArviZ, scikit-learn)."""
    yield
    import gc

    import torch

    gc.collect()
    torch.jit._state._python_cu.drop_all_functions()


def pytest_sessionfinish(session, exitstatus):
    """With ``PYRO_DROPOUT_ALL_EXTRAS=1`` (CI's runs with every extra installed) a test skipped
    for a missing optional package fails the run: there the skip would hide a broken install.
    Without it (``pip install -e ".[test]"`` alone) those tests skip, each with its extra."""
    import os

    if os.environ.get("PYRO_DROPOUT_ALL_EXTRAS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    missing = []
    for report in reporter.stats.get("skipped", []) if reporter else []:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "extra" in reason or "could not import" in reason:
            missing.append(f"{report.nodeid}: {reason}")
    if missing:
        reporter.write_line(
            "PYRO_DROPOUT_ALL_EXTRAS=1, yet tests skipped for a missing extra:\n  "
            + "\n  ".join(missing),
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

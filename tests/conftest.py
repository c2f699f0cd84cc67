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
    The library's compiled losses use no TorchScript (``pyro_dropout.infer.capture``); Pyro's
    traces are dropped after each module. The unit
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


#: CI runs the suite on two lines side by side, one core each (``.ci/run``): Python 3.11 with
#: ArviZ 0.23 and torch 2.13 (``PYRO_DROPOUT_CI_LINE=first``), Python 3.12 with ArviZ 1.x and the
#: newest torch (``second``). Both run the whole fast tier, every test of the ArviZ-facing code
#: (``tests/diagnostics``, ``tests/examples``) and the model zoo (``tests/zoo``, both tiers: the
#: models users bring, on both torch versions); the two heavy groups that do not depend on the
#: ArviZ line are split between them: the benchmark scripts' tests (``tests/bench``) on the
#: first, the other ``slow`` statistical tests on the second. Together they run every test, and
#: CI stays within its 30 minutes (each group was ~5-9 minutes of a ~35-minute line). Unset
#: (a plain ``python -m pytest``), nothing is left out.
BOTH_LINES = ("tests/diagnostics/", "tests/examples/", "tests/zoo/")

#: Slow tests outside tests/bench that the first line takes from the second, to balance them
#: (node ids or their prefixes): when the 3.12 line set up after the 3.11 line (~4-5 minutes
#: later), it was the long pole: tests 1,284 s against 1,075 s (CI at aa5f712), then, with two of
#: these cases moved, 1,492 s against 1,485 s (at 45a3e31). The three small-data cases are
#: ~115-150 s each (``--durations``). Since f33104e the set-ups run side by side (the 3.12 line's
#: tests start ~90 s after the 3.11 line's).
FIRST_LINE_SLOW = ("tests/infer/test_small_data_defaults.py::",)


def _left_to_the_other_line(item, line):
    path = item.nodeid.split("::", 1)[0]
    first_only = path.startswith("tests/bench/") or item.nodeid.startswith(FIRST_LINE_SLOW)
    second_only = (
        item.get_closest_marker("slow") is not None
        and not first_only
        and not path.startswith(BOTH_LINES)
    )
    return second_only if line == "first" else first_only


def pytest_collection_modifyitems(config, items):
    import os

    line = os.environ.get("PYRO_DROPOUT_CI_LINE", "")
    if not line:
        return
    if line not in ("first", "second"):
        raise pytest.UsageError(f"PYRO_DROPOUT_CI_LINE must be 'first' or 'second', got {line!r}")
    left = [item for item in items if _left_to_the_other_line(item, line)]
    if left:
        items[:] = [item for item in items if not _left_to_the_other_line(item, line)]
        config.hook.pytest_deselected(items=left)
    config._pd_ci_line = (line, len(left))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    line, left = getattr(config, "_pd_ci_line", ("", 0))
    if line:
        what = (
            "the slow tests outside tests/bench"
            if line == "first"
            else "tests/bench and FIRST_LINE_SLOW"
        )
        terminalreporter.write_line(
            f"PYRO_DROPOUT_CI_LINE={line}: {left} tests ({what}; diagnostics, examples, zoo excepted) "
            "left to the other CI line"
        )

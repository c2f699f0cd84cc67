"""Every benchmark records the code and software behind its numbers (benchmarks/_provenance)."""

import re
import subprocess

from pyro_dropout.benchmarks import _provenance


def test_git_state_names_this_checkout(monkeypatch):
    monkeypatch.delenv("PYRO_DROPOUT_COMMIT", raising=False)
    state = _provenance.git_state()
    assert re.fullmatch(r"[0-9a-f]{40}", state["commit"])
    assert state["dirty"] in (True, False)


def test_git_state_outside_git_is_none(monkeypatch):
    monkeypatch.delenv("PYRO_DROPOUT_COMMIT", raising=False)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert _provenance.git_state() == {"commit": None, "dirty": None}

    def not_a_repo(*args, **kwargs):
        return subprocess.CompletedProcess(args, 128, "", "fatal: not a git repository")

    monkeypatch.setattr(subprocess, "run", not_a_repo)
    assert _provenance.git_state() == {"commit": None, "dirty": None}


def test_versions_names_the_software():
    import pyro
    import torch

    v = _provenance.versions()
    assert v["torch"] == torch.__version__ and v["pyro"] == pyro.__version__
    assert set(v) == {"python", "torch", "pyro", "machine", "platform", "device"}
    assert v["device"] == "cpu"


def test_a_copy_names_its_commit_through_the_environment(monkeypatch):
    """A GPU machine gets a copy of the tree (its ``.git``, if any, stale): the run names the
    commit it copied, whatever git answers."""
    monkeypatch.setenv("PYRO_DROPOUT_COMMIT", "0123abc")
    assert _provenance.git_state() == {"commit": "0123abc", "dirty": None}

    def not_a_repo(*args, **kwargs):
        return subprocess.CompletedProcess(args, 128, "", "fatal: not a git repository")

    monkeypatch.setattr(subprocess, "run", not_a_repo)
    monkeypatch.setenv("PYRO_DROPOUT_COMMIT", "0123abc")
    assert _provenance.git_state() == {"commit": "0123abc", "dirty": None}

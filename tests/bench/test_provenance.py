"""Every benchmark records the code and software behind its numbers (benchmarks/_provenance)."""

import re
import subprocess

from benchmarks import _provenance


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


def test_dirty_means_the_code_differs_not_the_results(tmp_path, monkeypatch):
    """A run that writes results into the checkout does not make the next run's code "dirty";
    a changed source file does, of the library or of the benchmark scripts."""
    monkeypatch.delenv("PYRO_DROPOUT_COMMIT", raising=False)

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "ci@example.org")
    git("config", "user.name", "ci")
    (tmp_path / "pyro_dropout").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "pyro_dropout" / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "script.py").write_text("y = 1\n")
    (tmp_path / "results" / "summary.json").write_text("{}\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    package = tmp_path / "pyro_dropout"
    assert _provenance.git_state(package)["dirty"] is False
    (tmp_path / "results" / "summary.json").write_text('{"rows": 1}\n')
    assert _provenance.git_state(package)["dirty"] is False
    (tmp_path / "pyro_dropout" / "code.py").write_text("x = 2\n")
    assert _provenance.git_state(package)["dirty"] is True
    git("checkout", "-q", "--", "pyro_dropout")
    (tmp_path / "benchmarks" / "script.py").write_text("y = 2\n")
    assert _provenance.git_state(package)["dirty"] is True
    git("checkout", "-q", "--", "benchmarks")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert _provenance.git_state(package)["dirty"] is True

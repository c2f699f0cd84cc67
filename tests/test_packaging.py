"""The package's metadata: one version, the licence file, the type-information marker."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import pyro_dropout
from pyro_dropout import _version

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_written_once():
    """pyproject.toml reads the version from ``_version.py`` (setuptools' dynamic version)
    instead of repeating it, so a release changes one line."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "pyro_dropout._version.__version__"}
    assert pyro_dropout.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", pyro_dropout.__version__)


def test_the_installed_metadata_agrees_with_the_source():
    """The metadata pip installed (editable or wheel) carries the same version, as long as the
    install is of this tree's version (a stale install is the thing this catches)."""
    try:
        installed = importlib.metadata.version("pyro-dropout")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pyro-dropout is imported from the source tree, not installed")
    assert installed == pyro_dropout.__version__


def test_the_changelog_has_a_section_for_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{pyro_dropout.__version__}]" in changelog
    assert "## [Unreleased]" in changelog


def test_licence_and_type_marker_are_declared():
    """LICENSE goes into the wheel through ``license-files``, py.typed through package data
    (.ci/run checks the built wheel holds both)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "pyro_dropout" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["pyro_dropout"]

"""The documentation site builds with ``mkdocs build --strict`` (needs the ``docs`` extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        pytest.importorskip(module, reason="needs the docs extra: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    site = tmp_path / "site"
    for page in (
        "index.html",
        "guides/mc-dropout/index.html",
        "comparison/index.html",
        "api/guides/index.html",
        "examples/02_mauna_loa/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "api/guides/index.html").read_text(encoding="utf-8")
    assert 'id="pyro_dropout.guides.AutoDropout"' in api
    notebook = (site / "examples/02_mauna_loa/index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64" in notebook or "<img" in notebook

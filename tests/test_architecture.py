"""The package's import graph: no cycles, and no import going up the layers of
``docs/architecture.md``.

A short AST walk over ``pyro_dropout/``: every ``import`` and ``from ... import`` counts, at
module level and inside functions (a lazy import is still a dependency), and so does
``importlib.import_module("pyro_dropout...")`` with a literal name. ``from pkg import name``
is an edge to the submodule ``pkg.name`` when there is one, to ``pkg`` (its ``__init__``)
otherwise.

The package is the library only: the benchmark scripts are the repository's ``benchmarks/``
(``python -m benchmarks.<name>`` from the repository root), outside the package and the wheel,
and no module of the package imports them or their numba kernels.
"""

from __future__ import annotations

import ast
import graphlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pyro_dropout"

#: The layers, bottom first (as in docs/architecture.md). A module belongs to the longest entry
#: that is its name or a package above it; the bare package name only matches the package's
#: own ``__init__`` (the public API). A module may import its own layer and the layers below.
LAYERS = (
    (
        "base",
        (
            "pyro_dropout._broadcast",
            "pyro_dropout._checks",
            "pyro_dropout._nested",
            "pyro_dropout._trace",
            "pyro_dropout._version",
        ),
    ),
    ("datasets", ("pyro_dropout.datasets",)),
    ("distributions", ("pyro_dropout.distributions",)),
    ("nn", ("pyro_dropout.nn",)),
    ("handlers", ("pyro_dropout.handlers",)),
    ("guides", ("pyro_dropout.guides",)),
    ("infer", ("pyro_dropout.infer",)),
    ("diagnostics: ArviZ adapter", ("pyro_dropout.diagnostics._arviz_compat",)),
    ("diagnostics: draws", ("pyro_dropout.diagnostics.sampling",)),
    (
        "diagnostics: export",
        (
            "pyro_dropout.diagnostics.groups",
            "pyro_dropout.diagnostics.samples",
            "pyro_dropout.diagnostics.export",
            "pyro_dropout.diagnostics._reader",
        ),
    ),
    ("diagnostics: scores", ("pyro_dropout.diagnostics",)),
    ("public API", ("pyro_dropout",)),
    ("lightning", ("pyro_dropout.lightning",)),
    ("demo", ("pyro_dropout.demo",)),
)


def modules(root, package):
    """``{dotted name: (path, is_package)}`` of every module under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _deepest(name, known):
    """The module that ``import name`` runs last: ``name`` or the nearest package above it."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in known else None


def import_graph(root, package):
    """``{module: {imported module: first line}}`` for the imports inside ``package``."""
    known = modules(root, package)
    graph = {}
    for name, (path, is_package) in known.items():
        here = name if is_package else name.rsplit(".", 1)[0]
        edges = graph.setdefault(name, {})

        def add(target, line, edges=edges, name=name):
            if target is not None and target != name:
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(_deepest(alias.name, known), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    add(sub if sub in known else _deepest(source, known), node.lineno)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", None))
                in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                add(_deepest(node.args[0].value, known), node.lineno)
    return graph


def layer_of(module, layers, package):
    """Index of ``module``'s layer (None when no layer lists it)."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            matches = module == prefix or (prefix != package and module.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def cycles(graph):
    """One import cycle as a list of modules, or None."""
    try:
        graphlib.TopologicalSorter({m: set(e) for m, e in graph.items()}).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def upward_edges(graph, layers, package):
    """``(importer, line, imported, importer's layer, imported's layer)`` for each import of a
    higher layer, and ``(module, None, None, None, None)`` for each module in no layer."""
    bad = []
    for src in sorted(graph):
        ls = layer_of(src, layers, package)
        if ls is None:
            bad.append((src, None, None, None, None))
            continue
        for dst, line in sorted(graph[src].items()):
            ld = layer_of(dst, layers, package)
            if ld is not None and ld > ls:
                bad.append((src, line, dst, layers[ls][0], layers[ld][0]))
    return bad


def test_the_import_graph_has_no_cycle():
    cycle = cycles(import_graph(ROOT, PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_goes_up_a_layer():
    bad = upward_edges(import_graph(ROOT, PACKAGE), LAYERS, PACKAGE)
    assert not bad, "\n".join(
        f"{src} is in no layer of LAYERS (add it, and to docs/architecture.md)"
        if dst is None
        else f"{src}:{line} imports {dst}: layer '{ls}' below '{ld}'"
        for src, line, dst, ls, ld in bad
    )


def test_the_walk_sees_the_edges_that_matter():
    """Function-level imports, relative imports of submodules and of names, and the graph
    the tests above check is not empty."""
    graph = import_graph(ROOT, PACKAGE)
    assert "pyro_dropout.infer.elbo" in graph["pyro_dropout.infer.fit"]
    assert "pyro_dropout.diagnostics" in graph["pyro_dropout"]  # lazy, inside __getattr__
    assert "pyro_dropout.infer.capture" in graph["pyro_dropout.infer.compiled"]
    assert len(graph) > 60 and sum(map(len, graph.values())) > 150


def test_the_checks_can_fail(tmp_path):
    """On a package with an upward lazy import, a cycle and a module in no layer."""
    pkg = tmp_path / "house"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from .a import f\n")
    (pkg / "low" / "a.py").write_text("def f():\n    from ..high import g\n")
    (pkg / "low" / "b.py").write_text("from . import c\n")
    (pkg / "low" / "c.py").write_text("import house.low.b\n")
    (pkg / "high.py").write_text("def g():\n    pass\n")
    (pkg / "stray.py").write_text("import importlib\nimportlib.import_module('house.high')\n")
    layers = (("low", ("house.low",)), ("high", ("house.high", "house")))
    graph = import_graph(tmp_path, "house")
    assert graph["house.stray"] == {"house.high": 2}
    assert sorted(cycles(graph)[:-1]) == ["house.low.b", "house.low.c"]
    bad = upward_edges(graph, layers, "house")
    assert ("house.low.a", 2, "house.high", "low", "high") in bad
    assert ("house.stray", None, None, None, None) in bad


@pytest.mark.parametrize("name", [n for _, prefixes in LAYERS for n in prefixes])
def test_every_layer_entry_exists(name):
    assert name in modules(ROOT, PACKAGE), f"LAYERS names {name}, which is not a module"


#: Top-level modules the package must never import: the repository's benchmark scripts (not
#: installed) and the numba of their kernels (the ``benchmarks`` extra).
REPO_ONLY = ("benchmarks", "numba")


def absolute_imports(root, package):
    """``{module: {top-level name of each absolute import}}`` inside ``package``."""
    found = {}
    for name, (path, _) in modules(root, package).items():
        tops = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                tops.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops.add(node.module.split(".")[0])
    return found


def test_the_package_holds_no_benchmark_code():
    """The benchmark scripts are ``benchmarks/`` at the repository root, not a subpackage, and
    no module of the package imports them or numba (a wheel has neither)."""
    assert not (ROOT / PACKAGE / "benchmarks").exists(), (
        f"{PACKAGE}/benchmarks is back: benchmark code goes in the repository's benchmarks/"
    )
    assert (ROOT / "benchmarks" / "uci" / "__main__.py").is_file()
    bad = {
        name: sorted(tops.intersection(REPO_ONLY))
        for name, tops in absolute_imports(ROOT, PACKAGE).items()
        if tops.intersection(REPO_ONLY)
    }
    assert not bad, f"modules of the package import repository-only code: {bad}"


def test_the_import_check_can_fail(tmp_path):
    (tmp_path / "house").mkdir()
    (tmp_path / "house" / "__init__.py").write_text(
        "def f():\n    from benchmarks.uci import run\n"
    )
    (tmp_path / "house" / "k.py").write_text("import numba.core\nfrom . import x\n")
    assert absolute_imports(tmp_path, "house") == {"house": {"benchmarks"}, "house.k": {"numba"}}


def wheel_names(tmp_path):
    """The file names of the wheel that ``pyproject.toml`` builds, from a copy of the tree
    (setuptools writes its build folders beside the sources)."""
    src, out = tmp_path / "src", tmp_path / "dist"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in (PACKAGE, "benchmarks"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
    build = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", build, str(out)], cwd=src, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_holds_the_library_only(tmp_path):
    """What ``pip install pyro-dropout`` gets: the package, without the benchmark scripts or
    their numba kernels."""
    names = wheel_names(tmp_path)
    assert f"{PACKAGE}/__init__.py" in names and f"{PACKAGE}/infer/fit.py" in names
    modules_ = [n for n in names if n.endswith(".py")]
    assert all(n.startswith(f"{PACKAGE}/") for n in modules_), [
        n for n in modules_ if not n.startswith(f"{PACKAGE}/")
    ]
    assert not [n for n in names if "benchmarks" in n.split("/")[:-1]]

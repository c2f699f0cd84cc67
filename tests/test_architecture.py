"""The package's import graph: no cycles, and no import going up the layers of
``docs/architecture.md``.

A short AST walk over ``pyro_dropout/``: every ``import`` and ``from ... import`` counts, at
module level and inside functions (a lazy import is still a dependency), and so does
``importlib.import_module("pyro_dropout...")`` with a literal name. ``from pkg import name``
is an edge to the submodule ``pkg.name`` when there is one, to ``pkg`` (its ``__init__``)
otherwise.
"""

from __future__ import annotations

import ast
import graphlib
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
    ("benchmarks", ("pyro_dropout.benchmarks",)),
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
    assert "pyro_dropout.infer.traced" in graph["pyro_dropout.benchmarks.uci_model"]
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

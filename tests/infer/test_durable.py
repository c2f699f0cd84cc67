"""The default ``fit`` without TorchScript: ``import pyro_dropout`` needs none of it, each
route the compiled loss can take where torch lacks a piece is tried (one warning each, saying
why and what it costs), and a static scan lists where the package touches TorchScript and
private optimiser internals, so a new use fails here (issue 38).

TorchScript is deprecated upstream; these tests remove its pieces the way a future torch would
(in a subprocess where a removal would outlive the test)."""

import ast
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pyro
import pytest
import torch

from pyro_dropout import AutoDropout, BayesianMLP, fit, local_reparameterization
from pyro_dropout.infer import CompilationWarning, CompiledSVI, JitMeanFieldELBO, fused_adam, traced

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pyro_dropout"

#: The TorchScript pieces the compiled loss can use; a future torch may lack any of them.
TORCHSCRIPT = [
    "torch._C.ScriptModule",
    "torch._C.CompilationUnit",
    "torch.jit._trace._create_interpreter_name_lookup_fn",
    "torch.jit.optimized_execution",
    *[f"torch._C.{name}" for name in ("_jit_pass_peephole", "_jit_pass_cse", "_jit_pass_dce")],
]

_CHILD = r"""
import json, sys, warnings
import torch, torch.jit._trace

for path in json.loads(sys.argv[1]):
    owner, name = path.rsplit(".", 1)
    obj = {"torch": torch, "torch._C": torch._C, "torch.jit": torch.jit,
           "torch.jit._trace": torch.jit._trace}[owner]
    delattr(obj, name)
if sys.argv[2] == "raise":  # the public tracer is there but fails (a later torch's error)
    def trace(*args, **kwargs):
        raise RuntimeError("TorchScript was removed")
    torch.jit.trace = trace

import pyro_dropout as pd
lazy = sorted(m for m in sys.modules if m.split(".")[-1] in ("traced", "graph_passes"))

def run(jit):
    x = torch.linspace(-2, 2, 64).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1)
    model = pd.BayesianMLP(1, 1, hidden=(16,), tau=100.0)
    guide = pd.AutoDropout(model, dropout_rate=0.05)
    return pd.fit(model, guide, x, y, num_steps=200, batch_size=16, lr=1e-2, seed=0,
                  jit=jit, progress=False)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    losses = run("auto")
eager = run(False)
print(json.dumps({
    "lazy": lazy,
    "warnings": [[type(w.message).__name__, str(w.message)] for w in caught],
    "losses": losses,
    "eager": eager,
}))
"""


def _child(removed, tracer):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(removed), tracer],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tracer", ["delete", "raise"])
def test_without_torchscript_import_works_and_fit_trains_eagerly_with_one_warning(tracer):
    """All of TorchScript's pieces gone (and the public tracer deleted, or failing as a later
    torch's would): the import does not load the tracer's modules, and the default fit trains
    (the loss falls; 200 steps of 16 rows, same seed) with exactly one CompilationWarning that
    says why and what running eagerly costs; with no tracer at all its losses are the eager
    fit's, step for step (a failed trace runs the guide's set-up, and its initial draws, on a
    forked random stream, so the eager steps then draw other numbers). On b220d6f the import
    itself fails (ImportError of ``_create_interpreter_name_lookup_fn``)."""
    removed = TORCHSCRIPT + (["torch.jit.trace"] if tracer == "delete" else [])
    got = _child(removed, tracer)
    assert got["lazy"] == []  # `import pyro_dropout` loaded neither tracer module
    assert len(got["warnings"]) == 1, got["warnings"]
    kind, message = got["warnings"][0]
    assert kind == "CompilationWarning"
    assert "the loss is not compiled" in message and "slower" in message, message
    why = "no TorchScript tracer" if tracer == "delete" else "TorchScript was removed"
    assert why in message and "jit=False" in message, message
    if tracer == "delete":  # nothing traced: the random stream is the eager fit's
        assert got["losses"] == pytest.approx(got["eager"], rel=1e-6)
    losses = got["losses"]
    assert sum(losses[-20:]) < 0.5 * sum(losses[:20])  # it learned


def _x_y(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - 0.5 * x[:, 2] + 0.1 * torch.randn(n, generator=g)


def _compiled_steps(steps=6):
    """CompiledSVI + JitMeanFieldELBO, as ``fit`` trains: (ELBO, losses, warnings)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _x_y()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    guide = AutoDropout(model, dropout_rate=0.1)
    elbo = JitMeanFieldELBO(fallback=True, max_plate_nesting=1)
    svi = CompiledSVI(model, guide, fused_adam({"lr": 1e-2}), elbo)
    with warnings.catch_warnings(record=True) as caught, local_reparameterization():
        warnings.simplefilter("always")
        losses = [svi.step(x[:32], y[:32], num_data=64) for _ in range(steps)]
    # the checked graph of the one signature (traced and checked on the first two steps)
    ready = [
        next(iter(fn.compiled.values())) for fn, calls in elbo._compiled.values() if calls >= 2
    ]
    return elbo, ready, losses, list(caught)


def _remove(monkeypatch, what):
    if what == "_create_method_from_trace signature":

        def changed(self, *args):  # another torch's internal with another signature
            raise TypeError("_create_method_from_trace(): incompatible function arguments")

        monkeypatch.setattr(torch._C.ScriptModule, "_create_method_from_trace", changed)
    elif what == "name lookup renamed":
        # Deleting it from torch.jit._trace breaks torch.jit.trace too (its own helper): that
        # is the eager case. A torch that renamed it is what the library can meet here.
        monkeypatch.setattr(traced, "_name_lookup", lambda: None)
    elif what == "IR binding replaceInput":
        monkeypatch.delattr(torch._C.Node, "replaceInput")
    else:
        owner, name = what.rsplit(".", 1)
        monkeypatch.delattr(eval(owner, {"torch": torch}), name)  # noqa: S307 - a test's path


@pytest.mark.parametrize(
    "what",
    [
        "torch._C.CompilationUnit",
        "torch._C._jit_pass_cse",
        "name lookup renamed",
        "_create_method_from_trace signature",
        "IR binding replaceInput",
    ],
)
def test_without_an_internal_the_public_tracer_compiles_with_one_warning(monkeypatch, what):
    """One internal gone (or with another signature): the loss is still compiled, through the
    public ``torch.jit.trace`` (Pyro's ``check_trace=False``), with one CompilationWarning that
    names the missing piece and the cost (unsimplified graph, kept for the process's life).
    On b220d6f this fell to the eager loss (``torch.jit.trace``'s own check failed on the
    random draws) after a RuntimeWarning, or failed at import."""
    import torch.jit._trace  # noqa: F401 - the module whose attribute is removed

    monkeypatch.setattr(traced, "_fallback_warned", False)
    _remove(monkeypatch, what)
    elbo, ready, losses, caught = _compiled_steps()
    assert [w.category for w in caught] == [CompilationWarning], [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "public torch.jit.trace" in message and "not simplified" in message, message
    assert elbo.eager_reason is None and len(ready) == 1  # compiled and checked
    assert all(torch.isfinite(torch.tensor(losses)))


def test_jit_true_without_a_tracer_raises_and_says_what_to_do(monkeypatch):
    for what in ("torch._C.CompilationUnit", "torch.jit.trace"):
        _remove(monkeypatch, what)
    x, y = _x_y()
    model = BayesianMLP(3, 1, hidden=(8,), tau=25.0)
    with pytest.raises(RuntimeError, match="no TorchScript tracer.*jit=False"):
        fit(model, AutoDropout(model), x, y, num_steps=2, jit=True, progress=False, seed=0)


def test_the_default_route_warns_nothing_and_simplifies():
    """With every piece there (torch 2.13): the owned, simplified trace, no warning."""
    elbo, ready, _, caught = _compiled_steps()
    assert caught == [] and len(ready) == 1
    assert isinstance(ready[0], traced._OwnedTrace)


# -- the static scan ----------------------------------------------------------------------

#: Private optimiser internals (names read or written on torch's optimisers or ``torch``).
_OPTIM_PRIVATE = {
    "_fused_adam_": "_fused_adam",
    "_fused_adamw_": "_fused_adam",
    "_init_group": "_init_group",
    "_opt_called": "optimizer internals",
    "_optimizer_step_pre_hooks": "optimizer internals",
    "_optimizer_step_post_hooks": "optimizer internals",
    "_global_optimizer_pre_hooks": "optimizer internals",
    "_global_optimizer_post_hooks": "optimizer internals",
}

#: Where the package's code (comments and docstrings aside) names TorchScript (``torch.jit``,
#: ``torch._C``, their internals by name) or private optimiser internals, per module: what the
#: scan must find, no more, no less. Lazy: imported on first use, not by ``import pyro_dropout``.
EXPECTED = {
    "_trace.py": {"torch._C"},  # guarded: tracing() is False where the tracer is gone
    "infer/compiled.py": {"torch.jit"},  # guarded getattr: optimized_execution or none
    "infer/graph_passes.py": {"torch._C"},  # lazy (through traced)
    "infer/traced.py": {"torch._C", "torch.jit"},  # lazy; checked by unavailable()
    "nn/guided_value.py": {"torch._C"},  # DisableTorchFunctionSubclass: not TorchScript
}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _families(tree):
    """``{family: [line, ...]}`` of the TorchScript / private-optimiser uses in a module."""
    found = {}

    def add(family, line):
        found.setdefault(family, []).append(line)

    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            names = [dotted] if dotted else []
            if node.attr in _OPTIM_PRIVATE:
                add(_OPTIM_PRIVATE[node.attr], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value  # a name looked up with getattr/hasattr
            if value in _OPTIM_PRIVATE:
                add(_OPTIM_PRIVATE[value], node.lineno)
            elif value.startswith(("_jit_pass_", "_create_method_from_trace", "_create_interp")):
                add("torch._C", node.lineno)
        for name in names:
            if name.startswith("torch._C"):
                add("torch._C", node.lineno)
            elif name.startswith("torch.jit") or name.startswith("pyro.ops.jit"):
                add("torch.jit", node.lineno)
    return found


def _scan():
    table = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("benchmarks/"):
            continue  # measuring code, not the library's path
        found = _families(ast.parse(path.read_text(), filename=str(path)))
        if found:
            table[rel] = found
    return table


def test_where_torchscript_and_private_optimizer_apis_are_used():
    """The list is the state (issue 38): a new use anywhere fails, and so does a removal
    until ``EXPECTED`` says so. Every module listed but ``nn/guided_value.py`` is on fit's
    default path."""
    table = _scan()
    listing = "\n".join(
        f"{rel}: " + "; ".join(f"{fam} (lines {sorted(set(lines))})" for fam, lines in fams.items())
        for rel, fams in table.items()
    )
    assert {rel: set(fams) for rel, fams in table.items()} == EXPECTED, listing


def test_the_scan_sees_what_it_looks_for():
    src = (
        "import torch\nfrom torch.jit._trace import f\nx = torch._C.ScriptModule\n"
        "opt._init_group(g)\ngetattr(torch, '_fused_adam_')\nopt._opt_called = True\n"
        "hasattr(torch._C, '_jit_pass_cse')\n# torch.jit in a comment\n'torch._C in a string'\n"
    )
    found = _families(ast.parse(src))
    assert {k: sorted(set(v)) for k, v in found.items()} == {
        "torch.jit": [2],
        "torch._C": [3, 7],
        "_init_group": [4],
        "_fused_adam": [5],
        "optimizer internals": [6],
    }

"""What each graph pass of ``infer/capture.py`` removes: the captured loss's operation count
with every pass, and with each pass switched off alone (issue 38: which of the capture's lines
pay for themselves).

    PYTHONPATH=. python tools/capture_pass_ops.py            # every model below under the four guides
    PYTHONPATH=. python tools/capture_pass_ops.py --quick    # the W1 speed workload only

Models: the speed page's W1 and W2 workloads (``benchmarks/speed.py``'s ``_fit_step``: fit's
compiled step) and, through ``fit``, a heteroscedastic and a learned-prior ``BayesianMLP`` and
a ``bayesianize``'d ``nn.Sequential`` (tanh). A pass is switched off by replacing its function
in the capture module with a no-op for the captures of that column (restored after each).
Prints one row per model and guide and the totals; ``--json PATH`` writes them. A measuring
aid, not a test: time per pass is on the speed page ("What each capture pass buys").
"""

import argparse
import contextlib
import json
import warnings

import pyro
import torch

import pyro_dropout as pd
from benchmarks import speed
from pyro_dropout.infer import capture

#: Column name -> the capture functions it replaces with no-ops (``None``: every pass on).
PASSES = {
    "all passes": None,
    "no _combine_outputs": {"_combine_outputs": lambda *a, **k: None},
    "no scalar/identity rewrites": {
        "_identity_operand": lambda *a, **k: None,
        "_scalar_operands": lambda call, args, constants: (args, list(call.args)),
    },
    "no linear-bias fusion": {"_fuse_linear_bias": lambda *a, **k: None},
    "no merge of repeats": {"_merge_repeats": lambda *a, **k: None},
}
GUIDES = ("AutoDropout", "AutoConcreteDropout", "AutoMeanField", "AutoVariationalDropout")


@contextlib.contextmanager
def _switched_off(replacements):
    saved = {name: getattr(capture, name) for name in replacements or {}}
    try:
        for name, fn in (replacements or {}).items():
            setattr(capture, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(capture, name, fn)


@contextlib.contextmanager
def _recording(ops):
    """Append each capture's operation count to ``ops``."""
    original = capture.Captured.__init__

    def init(self, module, text, n):
        ops.append(n)
        original(self, module, text, n)

    capture.Captured.__init__ = init
    try:
        yield
    finally:
        capture.Captured.__init__ = original


def _speed_workload(name):
    def run(guide):
        w = speed.WORKLOADS[name]
        x, y = speed._data(w)
        step = speed._fit_step(w, guide, x, y)
        for _ in range(4):  # capture, capture again (the check), then the graph
            step()

    return run


def _fitted(make):
    def run(guide):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 8, generator=g), torch.randn(64, generator=g)
        model = make()
        pd.fit(model, getattr(pd, guide)(model), x, y, num_steps=4, batch_size=32, progress=False)

    return run


MODELS = {
    "W1": _speed_workload("W1"),
    "W2": _speed_workload("W2"),
    "heteroscedastic": _fitted(lambda: pd.BayesianMLP(8, 1, (50,), likelihood="heteroscedastic")),
    "learned prior": _fitted(lambda: pd.BayesianMLP(8, 1, (50,), prior="learned")),
    "bayesianize": _fitted(
        lambda: pd.BayesianModel(
            pd.bayesianize(
                torch.nn.Sequential(torch.nn.Linear(8, 20), torch.nn.Tanh(), torch.nn.Linear(20, 1))
            ),
            tau=5.0,
        )
    ),
}


def count(model, guide, column):
    """Operations of the last graph captured for ``model`` under ``guide`` with ``column``'s
    passes."""
    ops = []
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    with _switched_off(PASSES[column]), _recording(ops), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MODELS[model](guide)
    if not ops:
        raise RuntimeError(f"{model} / {guide}: nothing was captured")
    return ops[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the W1 workload only")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = ["W1"] if args.quick else list(MODELS)
    rows = {f"{m} / {g}": {c: count(m, g, c) for c in PASSES} for m in models for g in GUIDES}
    print("| model / guide | " + " | ".join(PASSES) + " |")
    print("| --- |" + " --- |" * len(PASSES))
    for key, counts in rows.items():
        print(f"| {key} | " + " | ".join(str(counts[c]) for c in PASSES) + " |")
    totals = {c: sum(r[c] for r in rows.values()) for c in PASSES}
    print("| **total** | " + " | ".join(str(totals[c]) for c in PASSES) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "totals": totals}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

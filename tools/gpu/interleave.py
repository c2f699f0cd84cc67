"""The speed benchmark's interleaved rounds with a synchronisation and a label after each
method: which replay fails after which method."""

import sys

import pyro
import torch

from benchmarks import speed

subset = sys.argv[1]  # graphs | all
torch.set_default_device("cuda")
pyro.enable_validation(False)
for wname, w in speed.WORKLOADS.items():
    pyro.clear_param_store()
    x, y = speed._data(w, 0)
    methods, steps, plain = speed._methods(w, x, y, 200, 10)
    if subset == "graphs":
        methods = {
            k: v
            for k, v in methods.items()
            if v[1] == "graph" or k in (speed.PLAIN, speed.PLAIN_GRAPH, f"fit: {v[2]}")
        }
    for _label, (fn, kind, _) in methods.items():
        speed._timeit(fn, 8 if kind == "graph" else 3)
    torch.cuda.synchronize()
    print(subset, wname, "warm-up ok", flush=True)
    last = None
    for r in range(3):
        for label, (fn, _kind, _) in methods.items():
            try:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"{subset} {wname} round {r} FAIL {label} (after {last}): {str(e)[:100]}")
                sys.exit(1)
            last = label
    print(subset, wname, "rounds ok", flush=True)

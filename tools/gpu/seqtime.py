"""The speed benchmark's methods timed one after another (each: warm-up, then 7 blocks of 50
steps, median), ratios and table as benchmarks.speed computes them."""

import json
import statistics
import sys

import pyro
import torch

from benchmarks import speed

out = sys.argv[1]
torch.set_default_device("cuda")
torch.manual_seed(0)
pyro.set_rng_seed(0)
pyro.enable_validation(False)
results = {}
for wname, w in speed.WORKLOADS.items():
    pyro.clear_param_store()
    x, y = speed._data(w, 0)
    methods, steps, plain = speed._methods(w, x, y, 1000, 100)
    med = {}
    for label, (fn, kind, _) in methods.items():
        speed._timeit(fn, 8 if kind == "graph" else 3)
        reps = 1 if "predict" in label and wname == "W2" else (5 if "predict" in label else 50)
        med[label] = statistics.median(speed._timeit(fn, reps) for _ in range(7))
        print(wname, label, f"{1e3 * med[label]:.3f} ms", flush=True)
    results[wname] = {"median_seconds": med, "ratios": speed._ratios(med), "workload": w}
report = {
    "settings": {
        "timing": "method by method (not interleaved): 7 blocks of 50 steps each",
        "device": "cuda",
        "predict_points": 1000,
        "predict_samples": 100,
    },
    "machine": {**speed.versions(), "gpu": torch.cuda.get_device_name()},
    "code": speed.git_state(),
    "results": results,
}
open(out + ".json", "w").write(json.dumps(report, indent=2, default=str))
open(out + ".md", "w").write(speed.markdown(report) + "\n")
print(speed.markdown(report))

"""Time to first step (issue 38): a default ``fit`` of the speed benchmark's W1 network
(AutoDropout, 3,000 steps of batch 32, set-up and compilation included) against the plain
``nn.Dropout`` loop's 3,000 steps, each timed in a fresh process of its own from the moment
its network exists (nothing compiled, cached or imported by the other before it).

    PYTHONPATH=<tree> python tools/time_to_first_step.py [--repeats 3]

Why each side in its own process: the first ``torch.optim`` optimiser a process builds imports
``torch._dynamo`` (``Optimizer.__init__`` is wrapped by ``torch._disable_dynamo``), 1-5 s on the
project's 2-core host, a cost every PyTorch training loop pays once. Timed in one process, the
second loop to build an optimiser skips it (this tool did that until 2026-11-28: ``fit`` first,
then the plain loop, so ``fit`` alone paid the import). Each line gives both times with and
without the plain loop's set-up (its ``nn.Module`` and ``torch.optim.Adam``), and the ratio
fit / (plain set-up + steps), the fair one; the plain steps alone are the issue's denominator,
also printed. Alternate fresh processes between trees for an A/B. A measuring aid, not a test.
"""

import argparse
import json
import subprocess
import sys

STEPS = 3000

_CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import pyro, torch
try:
    from benchmarks import speed
except ImportError:  # a tree from before the benchmarks left the package
    from pyro_dropout.benchmarks import speed
torch.set_num_threads(1)
w = speed.WORKLOADS["W1"]
x, y = speed._data(w)
pyro.set_rng_seed(0)
steps = int(sys.argv[2])
if sys.argv[1] == "fit":
    from pyro_dropout import AutoDropout, fit
    model = speed._bayesian_mlp(w)
    guide = AutoDropout(model, dropout_rate=w["p"])
    t0 = time.perf_counter()
    fit(model, guide, x, y, num_steps=steps, batch_size=w["batch"], progress=False, seed=0)
    out = {"total": time.perf_counter() - t0}
else:
    t0 = time.perf_counter()
    plain, _, _ = speed._plain_step_fn(w, x, y)  # the network and its torch.optim.Adam
    t1 = time.perf_counter()
    for _ in range(steps):
        plain()
    out = {"total": time.perf_counter() - t0, "setup": t1 - t0, "steps": time.perf_counter() - t1}
print(json.dumps(out))
"""


def _run(kind):
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(STEPS)], capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for _ in range(args.repeats):
        fit_s = _run("fit")["total"]
        plain = _run("plain")
        print(
            f"fit {fit_s:.2f} s; plain {plain['total']:.2f} s (set-up {plain['setup']:.2f} s, "
            f"steps {plain['steps']:.2f} s); fit / plain with set-up "
            f"{fit_s / plain['total']:.2f}, fit / plain steps {fit_s / plain['steps']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

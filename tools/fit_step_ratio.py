"""Ratio of fit's default training step to the plain ``nn.Dropout`` step, per guide, for
comparing two trees of the code in one sitting (an A/B; the speed page's "before / after").

    PYTHONPATH=<tree> python tools/fit_step_ratio.py W1 AutoDropout AutoMeanField ...

Uses the speed benchmark's set-up of the tree on ``PYTHONPATH`` (``benchmarks/speed.py``:
``_fit_step``, ``_plain_step_fn``), one thread; prints, per guide, the median over 5 interleaved
rounds of (fit's step time) / (plain step time). Alternate fresh processes between the trees.
A measuring aid, not a test.
"""

import statistics
import sys
import time

import pyro
import torch

try:
    from benchmarks import speed
except ImportError:  # a tree from before the benchmarks left the package (issue 41)
    from pyro_dropout.benchmarks import speed


def _timeit(fn, reps):
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    workload, guides = argv[0], argv[1:]
    torch.set_num_threads(1)
    w = speed.WORKLOADS[workload]
    x, y = speed._data(w)
    plain, _, _ = speed._plain_step_fn(w, x, y)
    steps = {}
    for guide in guides:
        pyro.set_rng_seed(0)
        steps[guide] = step = speed._fit_step(w, guide, x, y)
        for _ in range(4):  # trace, check, then the compiled steps
            step()
    reps = 40 if workload == "W2" else 1000
    ratios = {g: [] for g in steps}
    for _ in range(5):
        base = _timeit(plain, reps)
        for g, step in steps.items():
            ratios[g].append(_timeit(step, reps) / base)
    for g, r in ratios.items():
        print(f"{workload} {g} median ratio {statistics.median(r):.2f}")


if __name__ == "__main__":
    main()

"""Ratio of fit's default training step to the plain ``nn.Dropout`` step, per guide, for
comparing two trees of the code in one sitting (an A/B; the speed page's "before / after").

    PYTHONPATH=<tree> python tools/fit_step_ratio.py W1 AutoDropout AutoMeanField ...
    PYTHONPATH=<tree> python tools/fit_step_ratio.py --fastest W1 AutoConcreteDropout

Uses the speed benchmark's set-up of the tree on ``PYTHONPATH`` (``benchmarks/speed.py``:
``_fit_step``, ``_plain_step_fn``), one thread; prints, per guide, the median over 5 interleaved
rounds of (fit's step time) / (plain step time), or with ``--fastest`` the fastest of 15
interleaved rounds (200 steps at W1, 10 at W2) of each step over the fastest plain round (less
sensitive to a noisy host's bursts; the speed page's W1 A/Bs since 2026-11-29). Alternate fresh
processes between the trees. A measuring aid, not a test.
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
    fastest = "--fastest" in argv
    argv = [a for a in argv if a != "--fastest"]
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
    if fastest:
        reps, rounds = (10 if workload == "W2" else 200), 15
    else:
        reps, rounds = (40 if workload == "W2" else 1000), 5
    times = {g: [] for g in steps}
    bases = []
    for _ in range(rounds):
        bases.append(_timeit(plain, reps))
        for g, step in steps.items():
            times[g].append(_timeit(step, reps))
    for g, t in times.items():
        if fastest:
            print(f"{workload} {g} min-ratio {min(t) / min(bases):.2f}")
        else:
            ratio = statistics.median(s / b for s, b in zip(t, bases, strict=True))
            print(f"{workload} {g} median ratio {ratio:.2f}")


if __name__ == "__main__":
    main()

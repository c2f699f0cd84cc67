"""Time the batched UCI engine (``benchmarks/uci_model.py``) on one dataset and device: a
training step and a Monte-Carlo pass of the validation phase (all splits × the grid) and of
the final phase (one member per split), compiled and eager, for a few guides.

    python tools/uci_device_step.py --data-dir ../shared/data/uci --dataset kin8nm --device cuda

Prints one JSON line per (phase, guide, mode). A measuring aid for the speed page, not a test.
"""

import argparse
import json
import time

import torch

from pyro_dropout.benchmarks import uci_model as um
from pyro_dropout.benchmarks.uci import _stack_split_arrays
from pyro_dropout.datasets import load_uci


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--dataset", default="kin8nm")
    p.add_argument("--device", default="cpu")
    p.add_argument("--guides", default="dropout,meanfield")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--samples", type=int, default=200)
    args = p.parse_args(argv)
    ds = load_uci(args.dataset, args.data_dir)
    splits = list(range(ds.n_splits))
    for guide in args.guides.split(","):
        for phase in ("validation", "final"):
            val = phase == "validation"
            x, y, xe, ye, mu, sd = (t.to(args.device) for t in _stack_split_arrays(ds, splits, val))
            grid = um.grid(guide, ds.dropout_rates, ds.tau_values)
            per = len(grid) if val else 1
            configs = [dict(c) for _ in splits for c in grid] if val else [grid[-1]] * len(splits)
            members = um.Members(configs, sd.repeat_interleave(per).cpu(), x.shape[1])
            for jit in (True, False):
                model, g, eval_tau = um.build(guide, ds.n_features, ds.n_hidden, members)
                model.to(args.device)
                um.train(model, g, x, y, per, 1, max_steps=5, jit=jit)  # set-up and traces
                _sync(args.device)
                st = um.train(model, g, x, y, per, 1, max_steps=args.steps, jit=jit)
                _sync(args.device)
                ms = 1e3 * (st.wall_s - st.compile_s) / (st.steps - st.warm_steps)
                t0 = time.perf_counter()
                ev = um.evaluate(model, g, xe, ye, per, mu.repeat_interleave(per),
                                 sd.repeat_interleave(per), eval_tau(), args.samples, jit=jit)  # fmt: skip
                _sync(args.device)
                wall = time.perf_counter() - t0
                timed = args.samples - ev.compile_samples
                pass_ms = 1e3 * (wall - ev.compile_s) / max(timed, 1)
                row = dict(dataset=ds.name, device=args.device, phase=phase, guide=guide,
                           jit=jit, members=len(members), ms_per_step=round(ms, 3),
                           ms_per_mc_pass=round(pass_ms, 3))  # fmt: skip
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

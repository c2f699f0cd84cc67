"""Time the batched UCI engine (``benchmarks/uci_model/``) on one dataset and device: a
training step and a Monte-Carlo pass of the validation phase (all splits × the grid) and of
the final phase (one member per split), compiled and eager, for a few guides.

    PYTHONPATH=. python tools/uci_device_step.py --data-dir ../shared/data/uci --dataset kin8nm --device cuda

Prints one JSON line per (phase, guide, mode). A measuring aid for the speed page, not a test.
"""

import argparse
import json
import time

import torch

from benchmarks import uci_model as um
from benchmarks.uci import _stack_split_arrays
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
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead: the phases, FLOPs and GFLOP/s of one validation step (speed page)",
    )
    args = p.parse_args(argv)
    if args.profile:
        return profile(args)
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
                # build on the device: per-member prior scales live inside PyroSample
                # distributions, which model.to() does not move
                with torch.device(args.device):
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


def profile(args):
    """Phases of one batched validation step (``benchmarks/step_profile.py``), compiled and
    eager, with its matrix-product FLOPs and the matmul peak of this process."""
    import pyro

    from benchmarks import step_profile

    ds = load_uci(args.dataset, args.data_dir)
    splits = list(range(ds.n_splits))
    x, y, *_, sd = (t.to(args.device) for t in _stack_split_arrays(ds, splits, True))
    peak = step_profile.matmul_peak_gflops()
    pyro.enable_validation(False)
    for guide in args.guides.split(","):
        grid = um.grid(guide, ds.dropout_rates, ds.tau_values)
        members = um.Members(
            [dict(c) for _ in splits for c in grid],
            sd.repeat_interleave(len(grid)).cpu(),
            x.shape[1],
        )
        xb = um._expand_members(x[:, :128], len(grid))
        yb = um._expand_members(y[:, :128], len(grid))
        for compiled in (True, False):
            row = _profile_one(args, ds, guide, members, xb, yb, x.shape[1], compiled)
            row.update(matmul_peak_gflops=round(peak, 1))
            print(json.dumps(row), flush=True)


def _profile_one(args, ds, guide, members, xb, yb, n, compiled):
    from pyro.infer import SVI

    from benchmarks import step_profile
    from pyro_dropout import local_reparameterization
    from pyro_dropout.infer import JitMeanFieldELBO, MeanFieldELBO, fused_adam

    with torch.device(args.device):
        model, g, _ = um.build(guide, ds.n_features, ds.n_hidden, members)
    model.to(args.device)
    elbo = (JitMeanFieldELBO if compiled else MeanFieldELBO)(max_plate_nesting=2)
    svi = SVI(model, g, fused_adam({"lr": 1e-3}), elbo)
    kwargs = {"num_data": n}

    def step():
        with local_reparameterization():
            svi.step(xb, yb, **kwargs)

    def eager_loss_backward():
        eager = MeanFieldELBO(max_plate_nesting=2)
        with local_reparameterization():
            eager.differentiable_loss(model, g, xb, yb, **kwargs).backward()

    for _ in range(3):
        step()
    ph = step_profile.phases(
        model, g, elbo, step, (xb, yb), kwargs, local_reparameterization, 10, compiled
    )
    flops = step_profile.step_flops(eager_loss_backward)
    return dict(dataset=ds.name, device=args.device, guide=guide, compiled=compiled,
                members=len(members), phases_ms={k: round(v, 3) for k, v in ph.items()},
                mflop=round(flops / 1e6, 1), gflops_per_s=round(flops / ph["step"] / 1e6, 2))  # fmt: skip


if __name__ == "__main__":
    main()

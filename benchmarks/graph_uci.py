"""A batched UCI training step on a GPU with and without ``cuda_graph`` (same process).

    python -m benchmarks.graph_uci --data-dir ../shared/data/uci [--dataset kin8nm]
        [--guides dropout,meanfield,concrete] [--split-batch 2] [--steps 300]
        [--device cuda] [--json PATH]

The validation phase's batched model of the UCI driver (``benchmarks.uci``: splits x the
guide's grid as members of one model, the protocol's batch size) is trained for ``--steps``
steps by :func:`benchmarks.uci_model.train`: compiled (``CompiledSVI`` with
``JitMeanFieldELBO``, the route the driver takes on a GPU) without and with the step
recorded as a CUDA graph, interleaved in ``--rounds`` rounds. Reported: milliseconds per
step after each minibatch shape's first three steps (tracing the loss; the graph's warm-up
and recording are counted in), and the ratio graph / no graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from pyro_dropout.datasets import load_uci

from . import uci_model as um
from ._provenance import git_state, versions
from .uci.protocol import _full_epochs
from .uci.run import _stack_split_arrays


def _members(ds, guide, splits):
    grid = um.grid(guide, ds.dropout_rates, ds.tau_values)
    x, y, *_, y_std = _stack_split_arrays(ds, splits, True)
    configs = [dict(c) for _ in splits for c in grid]
    members = um.Members(configs, y_std.repeat_interleave(len(grid)), x.shape[1])
    return x, y, members, len(grid)


def _ms_per_step(ds, guide, splits, steps, batch_size, cuda_graph, seed):
    x, y, members, per = _members(ds, guide, splits)
    model, g, _ = um.build(guide, ds.n_features, ds.n_hidden, members)
    t0 = time.perf_counter()
    st = um.train(model, g, x, y, per, 1, batch_size=batch_size, max_steps=steps, seed=seed,
                  cuda_graph=cuda_graph)  # fmt: skip
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    first_s = st.compile_s
    steady = (wall - st.compile_s) / max(1, st.steps - st.warm_steps)
    return 1e3 * steady, first_s, len(members), st.final_loss


def run(data_dir, dataset, guides, split_batch, steps, rounds, device):
    ds = load_uci(dataset, data_dir)
    splits = list(range(split_batch))
    batch = 128
    rows = []
    previous = torch.get_default_device()
    torch.set_default_device(device)
    try:
        for guide in guides:
            times = {False: [], True: []}
            info = {}
            for _ in range(rounds):
                for graphed in (False, True):
                    ms, first_s, m, loss = _ms_per_step(ds, guide, splits, steps, batch, graphed, 0)
                    times[graphed].append(ms)
                    info[graphed] = (first_s, m, loss)
            plain, graph = (statistics.median(times[k]) for k in (False, True))
            rows.append({
                "guide": guide, "members": info[True][1], "ms_per_step": plain,
                "ms_per_step_graph": graph, "ratio": graph / plain,
                "first_steps_s": info[False][0], "first_steps_s_graph": info[True][0],
                "times": {str(k): v for k, v in times.items()},
                "final_loss": info[False][2], "final_loss_graph": info[True][2],
            })  # fmt: skip
    finally:
        torch.set_default_device(None if previous.type == "cpu" else previous)
    return {
        "settings": {
            "dataset": dataset,
            "splits": splits,
            "steps": steps,
            "rounds": rounds,
            "batch_size": batch,
            "device": str(device),
            "epochs_full_protocol": _full_epochs(ds),
        },  # fmt: skip
        "machine": {**versions(), "gpu": torch.cuda.get_device_name()},
        "code": git_state(),
        "rows": rows,
    }


def markdown(report):
    s = report["settings"]
    lines = [
        f"{s['dataset']}, validation phase, {len(s['splits'])} splits x grid as members of one "
        f"model, batch {s['batch_size']}, on {report['machine']['gpu']}:",
        "",
        "| guide | members | ms/step compiled | ms/step cuda_graph | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['guide']} | {r['members']} | {r['ms_per_step']:.3f} | "
            f"{r['ms_per_step_graph']:.3f} | {r['ratio']:.2f}× |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--dataset", default="kin8nm")
    p.add_argument("--guides", default="dropout,meanfield,concrete")
    p.add_argument("--split-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", type=Path, default=Path("graph_uci.json"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (CUDA graphs)")
    report = run(args.data_dir, args.dataset, args.guides.split(","), args.split_batch,
                 args.steps, args.rounds, torch.device(args.device))  # fmt: skip
    print(markdown(report))
    args.json.write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()

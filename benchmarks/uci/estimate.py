"""``--estimate``: time a few training steps and Monte-Carlo chunks of each phase and
project the wall time of the full protocol (``projection.json`` / ``projection.md``)."""

from __future__ import annotations

import math

from .. import uci_model as um
from .protocol import has_validation_phase, hidden_layers, protocol
from .run import _groups, _stack_split_arrays
from .units import _log


def estimate(ds, guide, splits, args, probe_steps=30, probe_samples=20):
    """Time a few training steps and Monte-Carlo chunks of each phase and project the wall
    time of the full protocol for ``splits`` (with the current settings). With
    ``--validate-single``: the validation phase alone, which that option runs."""
    settings = protocol(ds, guide, args)
    grid = settings["grid"]
    depth = hidden_layers(settings)
    out = {"dataset": ds.name, "guide": guide, "splits": len(splits), "phases": {}}
    total = 0.0
    only_validation = getattr(args, "validate_single", False)
    for phase, validation in (("validation", True), ("final", False)):
        # A one-configuration grid (concrete) has no validation phase (see run_dataset_guide)
        # unless --validate-single runs it, and then only it.
        if validation:
            skip = not (only_validation or has_validation_phase(guide, grid))
        else:
            skip = only_validation
        chunks = [] if skip else _groups(ds, splits, validation, args.split_batch)
        out["phases"][phase] = []
        phase_s = 0.0
        for chunk in chunks:
            x, y, x_eval, y_eval, y_mean, y_std = _stack_split_arrays(ds, chunk, validation)
            per = len(grid) if validation else 1
            configs = (
                [dict(c) for _ in chunk for c in grid] if validation else [grid[-1]] * len(chunk)
            )
            members = um.Members(configs, y_std.repeat_interleave(per), x.shape[1])
            model, g, eval_tau = um.build(
                guide, ds.n_features, ds.n_hidden, members, hidden_layers=depth
            )
            graph = getattr(args, "cuda_graph", False)  # --cuda-graph: time graphed steps
            um.train(model, g, x, y, per, 1, batch_size=settings["batch_size"], max_steps=5,
                     cuda_graph=graph)  # fmt: skip
            st = um.train(model, g, x, y, per, 1, batch_size=settings["batch_size"],
                          max_steps=probe_steps, cuda_graph=graph)  # fmt: skip
            # The compiled ELBO's first steps of each minibatch shape trace it: timed apart,
            # and counted once per shape (two in a run whose last batch is smaller).
            t_step = (st.wall_s - st.compile_s) / (st.steps - st.warm_steps)
            steps = settings["epochs"] * math.ceil(x.shape[1] / settings["batch_size"])
            shapes = 1 if x.shape[1] % settings["batch_size"] == 0 else 2
            samples = settings["val_mc_samples"] if validation else settings["mc_samples"]
            # At least three vectorised chunks: the first traces its graph and is timed apart.
            # the units of one pass: inputs, every hidden layer and the output (as evaluate())
            width = ds.n_features + depth * ds.n_hidden + 1
            _, mc_chunk = um._eval_blocks(
                len(members), x_eval.shape[1], width, samples, um._CHUNK_BUDGET
            )
            probe = min(samples, max(probe_samples, 3 * mc_chunk))
            ev = um.evaluate(
                model,
                g,
                x_eval,
                y_eval,
                per,
                y_mean.repeat_interleave(per),
                y_std.repeat_interleave(per),
                eval_tau(),
                probe,
                draws=settings["mc_draws"],
            )
            timed = probe - ev.compile_samples  # samples drawn by already-traced graphs
            if timed > 0:
                eval_s = (ev.wall_s - ev.compile_s) * samples / timed + ev.compile_s
            else:
                eval_s = ev.wall_s * samples / probe
            train_s = steps * t_step + shapes * st.compile_s
            phase_s += train_s + eval_s
            out["phases"].setdefault(phase, []).append(
                {
                    "splits": chunk,
                    "members": len(members),
                    "steps": steps,
                    "seconds_per_step": t_step,
                    "steps_per_s": 1 / t_step,
                    "eval_s": eval_s,
                    "jit": st.jit,
                    "engine": st.engine,
                    "units_per_pass": width,  # sizes the Monte-Carlo chunks
                    "projected_s": train_s + eval_s,
                }
            )
        out[f"{phase}_s"] = phase_s
        total += phase_s
    out["projected_s"] = total
    out["settings"] = settings
    _log(
        f"[{ds.name}/{guide}] projected: validation {_hms(out['validation_s'])}, final "
        f"{_hms(out['final_s'])}, total {_hms(total)}",
        args.quiet,
    )
    return out


def _projection_markdown(rows):
    lines = [
        "| dataset | guide | splits | val members | val steps | val steps/s | final members | "
        "final steps | final steps/s | MC eval (s) | projected wall time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        vs, fs = r["phases"]["validation"], r["phases"]["final"]
        ev = sum(p["eval_s"] for ph in r["phases"].values() for p in ph)
        cells = []
        for ph in (vs, fs):  # a phase not run (no grid; or --validate-single's final) is "–"
            if ph:
                cells.append(
                    f"{ph[0]['members']} | {sum(p['steps'] for p in ph)} | "
                    f"{ph[0]['steps_per_s']:.1f}"
                )
            else:
                cells.append("– | 0 | –")
        lines.append(
            f"| {r['dataset']} | {r['guide']} | {r['splits']} | {cells[0]} | {cells[1]} | "
            f"{ev:.0f} | {_hms(r['projected_s'])} |"
        )
    return "\n".join(lines) + "\n"


def _hms(seconds):
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"

"""Large streamed data: examples per second and peak memory of ``fit`` and of the Lightning
``Trainer`` (1 and 2 processes) against a plain PyTorch ``nn.Dropout`` MLP on the same loader.

    python -m benchmarks.scale [--quick] [--rows N] [--json PATH] [--markdown PATH]

The data: :class:`StreamedRegression`, a regression set of ``--rows`` rows (default 10^6, 8
features) generated block by block on the fly: block ``k`` of ``batch`` rows is drawn from a
generator seeded with ``(seed, k)``, so every pass yields the same rows, nothing is stored, and
memory does not grow with the number of rows. Under DDP rank ``r`` of ``R`` reads the blocks
``k ≡ r (mod R)``: disjoint shards (a stream takes the place of Lightning's
``DistributedSampler``).

Each configuration runs one pass over the rows in a fresh process (``--worker``), which reports
the training loop's wall time and examples per second, its examples per CPU-second (rank 0's
CPU time times the number of processes: on a shared machine other jobs inflate wall time,
hardly CPU time) and the process's peak resident memory (``ru_maxrss``); the two-process
Trainer is Lightning's ``strategy="ddp"`` on CPU (gloo), rank 0 reporting. Every worker first
times the plain ``nn.Dropout`` MLP (same architecture, dropout rate, Adam, learning rate;
mean-squared error) on the first ``--baseline-rows`` rows of the same stream, so each
configuration's CPU-cost ratio is to a baseline measured in its own process.
``--quick`` runs a tiny stream in this process (no workers, no DDP) for the smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyro
import torch
from torch.utils.data import DataLoader, IterableDataset

from pyro_dropout import AutoDropout, BayesianMLP, fit

from ._provenance import git_state, versions

FEATURES = 8
HIDDEN = (64, 64)
DROPOUT = 0.1
LR = 1e-3
TAU = 25.0

CONFIGS = {
    "fit": "fit(model, AutoDropout, loader, num_data=N) (eager MeanFieldELBO, LRT)",
    "fit-jit": "fit(..., jit=True) (JitMeanFieldELBO, LRT)",
    "trainer-1": "lightning.Trainer, 1 process: BayesianModule(model, AutoDropout)",
    "trainer-2": "lightning.Trainer, 2 processes: strategy='ddp' (gloo)",
    "trainer-1-jit": "BayesianModule(..., jit=True), 1 process",
    "trainer-2-jit": "BayesianModule(..., jit=True), 2 processes (ddp)",
}


def _devices(name):
    return 2 if name.startswith("trainer-2") else 1


class StreamedRegression(IterableDataset):
    """``rows`` regression rows, generated in blocks of ``batch`` rows (module docs); yields
    ``(x, y)`` minibatches (use ``DataLoader(ds, batch_size=None)``). One pass of a DDP rank
    yields its shard; :attr:`num_data` is the whole set's size, the ``N`` of the minibatch
    scale."""

    def __init__(self, rows, batch=1024, seed=0, limit=None):
        self.rows, self.batch, self.seed = int(rows), int(batch), int(seed)
        self.limit = limit  # read only the first `limit` rows (the baseline's share)
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(FEATURES, generator=g) / FEATURES**0.5

    @property
    def num_data(self):
        return self.rows

    def _block(self, k):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + k)
        n = min(self.batch, self.rows - k * self.batch)
        x = torch.randn(n, FEATURES, generator=g)
        f = x @ self.w + torch.sin(2 * x[:, 0]) * x[:, 1]
        return x, f + 0.2 * torch.randn(n, generator=g)

    def __iter__(self):
        rank, world = 0, 1
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        blocks = -(-self.rows // self.batch)
        if self.limit is not None:
            blocks = min(blocks, -(-self.limit // self.batch))
        # Every rank the same number of steps (DDP all-reduces every step: a rank with one
        # block more would wait forever); the last `blocks % world` blocks are left out.
        per_rank = blocks // world
        for i in range(per_rank):
            yield self._block(rank + i * world)


def _plain_pass(ds):
    """One pass of a plain nn.Dropout MLP with Adam on ``ds``; returns (seconds, rows)."""
    layers, d = [], FEATURES
    for h in HIDDEN:
        layers += [torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Dropout(DROPOUT)]
        d = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(d, 1))
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    rows = 0
    start, cpu = time.perf_counter(), time.process_time()
    for x, y in DataLoader(ds, batch_size=None):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x).squeeze(-1), y)
        loss.backward()
        opt.step()
        rows += x.shape[0]
    return time.perf_counter() - start, time.process_time() - cpu, rows


def _bayesian(seed):
    pyro.set_rng_seed(seed)
    model = BayesianMLP(FEATURES, 1, hidden=HIDDEN, tau=TAU)
    return model, AutoDropout(model, dropout_rate=DROPOUT, input_dropout_rate=DROPOUT)


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_config(name, rows, batch=1024, baseline_rows=200_000, seed=0, devices=1):
    """One configuration in this process; returns its measurements (rank 0's under DDP)."""
    torch.set_num_threads(1)  # one thread per process: 2 processes on 2 cores
    # Validation off, as fit after its first step (see docs/benchmarks/speed.md).
    with pyro.validation_enabled(False):
        return _run_config(name, rows, batch, baseline_rows, seed, devices)


def _run_config(name, rows, batch, baseline_rows, seed, devices):
    base_s, base_cpu, base_rows = _plain_pass(
        StreamedRegression(rows, batch, seed, limit=baseline_rows)
    )
    ds = StreamedRegression(rows, batch, seed)
    loader = DataLoader(ds, batch_size=None)
    model, guide = _bayesian(seed)
    steps = -(-rows // batch)
    rank = 0
    if name in ("fit", "fit-jit"):
        start, cpu = time.perf_counter(), time.process_time()
        losses = fit(
            model, guide, loader, num_data=rows, num_steps=steps, lr=LR, jit=name == "fit-jit",
            progress=False,
        )  # fmt: skip
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        final = sum(losses[-20:]) / len(losses[-20:])
    elif name.startswith("trainer"):
        jit = name.endswith("-jit")
        seconds, cpu_seconds, final, rank = _trainer_pass(
            model, guide, loader, rows, devices, seed, jit
        )
    else:
        raise ValueError(f"unknown configuration {name!r}")
    # Rows one pass trains on: under DDP the last `blocks % devices` blocks are left out.
    blocks = -(-rows // batch)
    done = rows if blocks % devices == 0 else (blocks // devices) * devices * batch
    return {
        "config": name,
        "rank": rank,
        "rows": rows,
        "rows_trained": done,
        "batch": batch,
        "seconds": seconds,
        "examples_per_s": done / seconds,
        "baseline_examples_per_s": base_rows / base_s,
        # Per CPU-second of the training processes (rank 0's CPU time times the number of
        # processes): much less sensitive than wall time to other jobs on a shared machine.
        "cpu_seconds_rank0": cpu_seconds,
        "examples_per_cpu_s": done / (devices * cpu_seconds),
        "baseline_examples_per_cpu_s": base_rows / base_cpu,
        "ratio_to_plain": (base_rows / base_cpu) / (done / (devices * cpu_seconds)),
        "final_neg_elbo_per_row": final / rows,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _trainer_pass(model, guide, loader, rows, devices, seed, jit=False):
    import lightning as L

    from pyro_dropout.lightning import BayesianModule, make_trainer

    class Clock(L.Callback):
        def on_train_start(self, trainer, module):
            trainer.strategy.barrier()
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_train_end(self, trainer, module):
            trainer.strategy.barrier()
            self.seconds = time.perf_counter() - self.start
            self.cpu_seconds = time.process_time() - self.cpu

    x, y = next(iter(loader))
    module = BayesianModule(model, guide, example=(x, y), num_data=rows, lr=LR, seed=seed, jit=jit)
    clock = Clock()
    trainer = make_trainer(
        devices, max_epochs=1, accelerator="cpu", progress=False, callbacks=[clock]
    )
    trainer.fit(module, loader)
    final = trainer.callback_metrics["elbo"].item() * -1
    return clock.seconds, clock.cpu_seconds, final, trainer.global_rank


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(name, rows, batch, baseline_rows, seed, timeout):
    devices = _devices(name)
    cmd = [sys.executable, "-m", "benchmarks.scale", "--worker", name]
    cmd += ["--rows", str(rows), "--batch", str(batch), "--baseline-rows", str(baseline_rows)]
    cmd += ["--seed", str(seed)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # The scripts are not installed: the worker finds them from the repository root.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1])
    result["devices"] = devices
    return result


def run(quick=False, rows=1_000_000, small_rows=100_000, batch=1024, seed=0):
    """All configurations (module docs); ``quick``: tiny, in this process."""
    if quick:
        rows, batch = 4096, 256
        results = [
            run_config(name, rows, batch, baseline_rows=rows, seed=seed)
            for name in ("fit", "trainer-1")
        ]
        memory = []
    else:
        baseline_rows = min(rows, 200_000)
        results = [_worker(name, rows, batch, baseline_rows, seed, timeout=900) for name in CONFIGS]
        # Memory as rows grow: the same configurations on 10x fewer rows.
        memory = [
            _worker(name, small_rows, batch, min(small_rows, baseline_rows), seed, timeout=900)
            for name in ("fit", "trainer-1")
        ]
    return {
        "code": git_state(),
        "machine": {**versions(), "cpus": os.cpu_count()},
        "settings": {
            "rows": rows,
            "batch": batch,
            "features": FEATURES,
            "hidden": list(HIDDEN),
            "dropout": DROPOUT,
            "lr": LR,
            "quick": quick,
        },
        "results": results,
        "memory_small": memory,
    }


def markdown(report):
    s = report["settings"]
    lines = [
        f"Rows: {s['rows']:,} streamed, batch {s['batch']}, {s['features']}-"
        f"{'-'.join(map(str, s['hidden']))}-1 ReLU MLP, dropout {s['dropout']}, one pass.",
        "",
        "| configuration | processes | wall time (s) | examples/s (wall) | examples per "
        "CPU-second | plain nn.Dropout, per CPU-second (same process) | CPU cost vs plain | "
        "peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['config']} | {r.get('devices', 1)} | {r['seconds']:.1f} | "
            f"{r['examples_per_s']:,.0f} | {r['examples_per_cpu_s']:,.0f} | "
            f"{r['baseline_examples_per_cpu_s']:,.0f} | {r['ratio_to_plain']:.2f}× | "
            f"{r['peak_rss_mb']:.0f} |"
        )
    if report["memory_small"]:
        big = {r["config"]: r for r in report["results"]}
        lines += [
            "",
            "| configuration | peak RSS at "
            f"{report['memory_small'][0]['rows']:,} rows (MB) | at {s['rows']:,} rows (MB) |",
            "| --- | --- | --- |",
        ]
        for r in report["memory_small"]:
            lines.append(
                f"| {r['config']} | {r['peak_rss_mb']:.0f} | {big[r['config']]['peak_rss_mb']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny in-process run (smoke test)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--baseline-rows", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("scale.json"))
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one configuration in this (fresh) process; rank 0 prints JSON
        devices = _devices(args.worker)
        out = run_config(args.worker, args.rows, args.batch, args.baseline_rows, args.seed, devices)
        if out["rank"] == 0:
            print(json.dumps(out), flush=True)
        return out
    report = run(args.quick, args.rows, args.small_rows, args.batch, args.seed)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table)
    return report


if __name__ == "__main__":
    main()

"""A reference posterior from Hamiltonian Monte Carlo (Pyro's NUTS) on the user's own model.

The approximate posteriors of this library (and Pyro's autoguides) are judged against it with
the fidelity scores of :mod:`pyro_dropout.diagnostics.fidelity`, following Izmailov, Vikram,
Hoffman & Wilson (2021), "What are Bayesian neural network posteriors really like?", ICML,
who use full-batch HMC as the reference for BNN posteriors.

Convergence is judged in **function space**: the rank-normalised split R-hat and the bulk /
tail ESS (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021, "Rank-normalization, folding,
and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis) of
the predictive mean (regression) or of the predictive class probabilities (classification) at
each test input, as Izmailov et al. (2021, Sec. 4) do. Weight-space R-hat means little for a
BNN: hidden units can be permuted (and signs flipped under odd activations) without changing
the function, so chains in different symmetric modes disagree in weight space while agreeing
in what they predict.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import sys
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

import numpy as np
import pandas as pd
import pyro
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide.initialization import init_to_uniform, init_to_value
from pyro.poutine.util import is_validation_enabled

from ..handlers import weight_draws
from ..infer.compile_warning import CompilationWarning
from ..infer.conform import conform_data
from ..infer.draws.modes import module_mode as _module_mode
from . import _arviz_compat as compat
from . import _reader as rd
from .samples import samples_inference_data
from .sampling import check_inputs

__all__ = [
    "RHAT_THRESHOLD",
    "ReferenceConvergenceWarning",
    "predictive_convergence",
    "reference_posterior",
]

#: Largest function-space R-hat accepted without a warning (Vehtari et al. 2021 recommend 1.01
#: for final results; 1.05 is the laxer threshold Izmailov et al. 2021 report for BNNs).
RHAT_THRESHOLD = 1.05


class ReferenceConvergenceWarning(UserWarning):
    """The NUTS chains disagree in function space (R-hat above the threshold)."""


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _run_chain(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One NUTS chain; runs in this process or in a spawned worker (``spec`` is picklable).
    Torch's thread count, default dtype and Pyro's validation flag are restored afterwards."""
    saved = (torch.get_num_threads(), torch.get_default_dtype(), is_validation_enabled())
    try:
        # one thread per chain: two threads per chain on a loaded 2-core box were ~10x slower,
        # and chains in parallel processes must not oversubscribe the cores
        torch.set_num_threads(1)
        torch.set_default_dtype(spec["default_dtype"])  # a spawned worker starts at float32
        pyro.enable_validation(spec["validation"])
        return _nuts_chain(spec)
    finally:
        torch.set_num_threads(saved[0])
        torch.set_default_dtype(saved[1])
        pyro.enable_validation(saved[2])


#: In a worker process: the queue that reports each chain's progress to the parent
#: (set by :func:`_init_worker`; None in the parent and without ``progress``).
_PROGRESS_QUEUE: Any = None
#: Seconds between two progress reports of one chain.
_PROGRESS_EVERY_S = 0.25


def _init_worker(queue: Any) -> None:
    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = queue


def _progress_hook(queue: Any, chain: int, spec: Mapping[str, Any]):
    """Pyro's ``hook_fn``: report ``(chain, iterations done)`` at most every 0.25 s."""
    warmup, total = spec["num_warmup"], spec["num_warmup"] + spec["num_samples"]
    last = [0.0]

    def hook(kernel, params, stage, i):
        done = i + 1 + (warmup if stage.startswith("Sample") else 0)
        now = time.monotonic()
        if now - last[0] >= _PROGRESS_EVERY_S or done == total:
            last[0] = now
            queue.put((chain, done))

    return hook


def _run_parallel(specs: list[dict], processes: int, progress: bool) -> list[dict[str, Any]]:
    """The chains in ``processes`` spawned workers; with ``progress``, one bar per chain and
    one line per finished chain (stderr; widgets in a notebook)."""
    ctx = multiprocessing.get_context("spawn")  # fork + torch threads can deadlock
    queue = ctx.Queue() if progress else None
    with ProcessPoolExecutor(
        max_workers=processes, mp_context=ctx, initializer=_init_worker, initargs=(queue,)
    ) as pool:
        futures = [pool.submit(_run_chain, s) for s in specs]
        if not progress:
            return [f.result() for f in futures]
        from tqdm.auto import tqdm

        total = specs[0]["num_warmup"] + specs[0]["num_samples"]
        bars = [
            tqdm(total=total, desc=f"NUTS chain {c}", position=c, unit="it", leave=True)
            for c in range(len(specs))
        ]
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(
                    pending, timeout=_PROGRESS_EVERY_S, return_when=FIRST_COMPLETED
                )
                _drain(queue, bars)
                for f in done:
                    c = futures.index(f)
                    r = f.result()  # a failed chain raises here
                    bars[c].update(total - bars[c].n)
                    bars[c].set_postfix_str("done", refresh=True)
                    bars[c].write(
                        f"NUTS chain {c} finished: {r['wall_s']:.1f} s, "
                        f"{len(r['divergences'])} divergences, acceptance {r['accept_rate']:.2f}, "
                        f"step size {r['step_size']:.3g}",
                        file=sys.stderr,  # with the bars (tqdm.write's default is stdout)
                    )
        finally:
            for b in bars:
                b.close()
        return [f.result() for f in futures]


def _drain(queue: Any, bars: list) -> None:
    import queue as queue_mod

    while True:
        try:
            chain, done = queue.get_nowait()
        except queue_mod.Empty:
            return
        bars[chain].update(max(0, done - bars[chain].n))


#: What running NUTS uncompiled costs, for the warning (an 8-50-1 network, module docs).
UNCOMPILED_COST = "about 1.6x the time per gradient (1.70 instead of 1.03 ms on an 8-50-1 network)"


def _probe(t):
    return t + 1


def tracer_unavailable() -> str | None:
    """Why ``torch.jit.trace``, which Pyro's ``jit_compile`` runs, cannot trace in this torch
    (``None`` where it can). TorchScript is deprecated upstream and its tracer may go or raise
    in a later torch: then the NUTS reference runs uncompiled instead of failing."""
    trace = getattr(torch.jit, "trace", None)
    if trace is None:
        return "torch.jit.trace is missing"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its deprecation warning (the run filters it too)
            trace(_probe, torch.zeros(1))
    except Exception as err:  # noqa: BLE001 - whatever a removed tracer raises
        return f"torch.jit.trace raised {type(err).__name__}: {err}"
    return None


def _resolve_jit(jit_compile: Any) -> bool:
    """``jit_compile`` as run: ``"auto"`` is Pyro's JIT where the tracer works, else off with
    one :class:`~pyro_dropout.infer.CompilationWarning`; ``True`` where it does not raises."""
    if jit_compile is False:
        return False
    if jit_compile is not True and jit_compile != "auto":
        raise ValueError(f"jit_compile must be True, False or 'auto'; got {jit_compile!r}")
    why = tracer_unavailable()
    if why is None:
        return True
    if jit_compile is True:
        raise RuntimeError(
            f"reference_posterior(jit_compile=True) needs TorchScript's tracer ({why}); pass "
            "jit_compile='auto' (the default) or False to run NUTS uncompiled"
        )
    warnings.warn(
        f"pyro_dropout: reference_posterior runs NUTS without Pyro's JIT ({why}): the same "
        f"chains, {UNCOMPILED_COST}. Pass jit_compile=False to run uncompiled without this "
        "warning.",
        CompilationWarning,
        stacklevel=3,
    )
    return False


def _nuts_chain(spec: Mapping[str, Any]) -> dict[str, Any]:
    pyro.set_rng_seed(spec["seed"])
    model = spec["model"]
    if isinstance(model, bytes):
        model = pickle.loads(model)
    init = spec["init_values"]
    strategy = init_to_value(values=init) if init else init_to_uniform
    # The model as the user wrote it, with weight draws even inside an enclosing
    # local_reparameterization() block: NUTS needs log p(theta, D) at explicit weights.
    kernel = NUTS(
        weight_draws(model),
        jit_compile=spec["jit_compile"],
        ignore_jit_warnings=True,
        max_tree_depth=spec["max_tree_depth"],
        target_accept_prob=spec["target_accept_prob"],
        init_strategy=strategy,
    )
    queue = _PROGRESS_QUEUE if spec.get("progress_queue") else None
    mcmc = MCMC(
        kernel,
        num_samples=spec["num_samples"],
        warmup_steps=spec["num_warmup"],
        num_chains=1,
        # in a worker, Pyro's bar would interleave with the other workers' on one terminal:
        # the parent draws one bar per chain from what the hook reports instead
        disable_progbar=not spec["progress"] or queue is not None,
        hook_fn=None if queue is None else _progress_hook(queue, spec.get("chain", 0), spec),
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        # Pyro's JIT uses torch.jit.trace, deprecated (still working) in recent torch.
        warnings.filterwarnings("ignore", message=".*torch.jit.trace. is deprecated")
        mcmc.run(*spec["args"])
    wall = time.perf_counter() - start
    # the kernel's counters as MCMC recorded them before the kernel's cleanup (the public
    # MCMC.diagnostics() also computes Pyro's weight-space R-hat, which fails below 4 draws
    # and is not what convergence is judged by here)
    recorded = getattr(mcmc, "_diagnostics", None) or [{}]
    diag = recorded[0]
    return {
        "samples": {k: v.detach().cpu() for k, v in mcmc.get_samples().items()},
        "divergences": [int(i) for i in diag.get("divergences", [])],
        "accept_rate": float(diag.get("acceptance rate", np.nan)),
        "step_size": float(kernel.step_size),
        "wall_s": wall,
    }


def _main_objects(model: Any) -> list[str]:
    """Names of the classes and functions defined in ``__main__`` that pickling ``model``
    refers to by name (plain pickle saves classes and functions by reference)."""
    found: list[str] = []

    class _Finder(pickle.Pickler):
        def persistent_id(self, obj: Any) -> None:
            if (
                isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__")
            ) and getattr(obj, "__module__", None) == "__main__":
                name = getattr(obj, "__qualname__", repr(obj))
                if name not in found:
                    found.append(name)
            return None

    import io

    try:
        _Finder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    except Exception:
        if not found:
            raise
        # e.g. a class whose name does not resolve in __main__: cloudpickle sends it by value
    return found


def _main_without_file() -> bool:
    """Whether ``__main__`` cannot be re-imported by a spawned worker (a notebook, a REPL,
    ``python -c``): spawn re-runs ``__main__`` from its file, and only when it has one."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return not path or not os.path.exists(path)


def _picklable(model: Any) -> tuple[Any, str | None]:
    """``(model or its cloudpickle bytes, None)`` to send to a spawned worker, or
    ``(None, reason)`` when it cannot be sent.

    Plain pickle refers to classes by name; a worker cannot import a class defined in a
    notebook or ``python -c`` (``__main__`` without a file): "Can't get attribute 'Tiny' on
    <module '__main__'>". Such models, and models plain pickle refuses (this library's layers
    hold lambdas), go by value with cloudpickle.
    """
    try:
        in_main = _main_objects(model)
    except Exception:  # noqa: BLE001 - plain pickle refuses it: cloudpickle below
        in_main = None
    if in_main == [] or (in_main and not _main_without_file()):
        return model, None
    why = (
        f"{', '.join(in_main)} {'is' if len(in_main) == 1 else 'are'} defined in __main__, which "
        "worker processes cannot import (a notebook, a REPL or python -c)"
        if in_main
        else "plain pickle cannot send the model to a worker process"
    )
    try:
        import cloudpickle
    except ImportError:
        return None, f"{why}, and cloudpickle is not installed (pip install cloudpickle)"
    try:
        return cloudpickle.dumps(model), None
    except Exception as e:  # noqa: BLE001 - any pickling failure, reported
        return None, f"{why}, and cloudpickle failed too ({type(e).__name__}: {e})"


def _init_values(model: Any, guide: Any, x: Any, y: Any, seed: int) -> dict[str, torch.Tensor]:
    """One draw of the model's latent sites from a fitted guide (weight draws, hidden)."""
    pyro.set_rng_seed(seed)
    with poutine.block(), weight_draws(), torch.no_grad():
        g_tr = poutine.trace(guide).get_trace(x, y)
        m_tr = poutine.trace(poutine.replay(model, trace=g_tr)).get_trace(x, y)
    return {
        name: site["value"].detach().clone()
        for name, site in m_tr.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name in g_tr.nodes
    }


def predictive_convergence(data: Any, group: str | None = None) -> pd.DataFrame:
    """Function-space R-hat and ESS of a multi-chain export, one row per (point, output).

    The quantity is the per-draw predictive mean ``<obs>_mean`` (regression) or the class
    probabilities ``<obs>_probs`` (classification) of ``group`` (default ``"predictions"``,
    the test inputs, else ``"posterior_predictive"``); columns ``rhat`` (rank-normalised split
    R-hat), ``ess_bulk``, ``ess_tail`` (ArviZ, Vehtari et al. 2021).

    Example:
        >>> predictive_convergence(ref)["rhat"].max() < 1.05  # doctest: +SKIP
    """
    obs = rd.obs_name(data)
    if group is None:
        group = "predictions" if compat.has_group(data, "predictions") else "posterior_predictive"
    ds = compat.get_group(data, group)
    var = f"{obs}_probs" if f"{obs}_probs" in ds else f"{obs}_mean"
    if var not in ds:
        var = obs  # neither mean nor probabilities: the predictive draws themselves
    da = ds[var]
    if da.sizes["chain"] < 2:
        raise ValueError("function-space R-hat needs at least two chains")
    rhat, bulk, tail = compat.rhat_ess(da)
    index = pd.MultiIndex.from_product(
        [range(n) for n in da.shape[2:]] or [range(1)],
        names=list(da.dims[2:]) or ["point"],
    )
    return pd.DataFrame(
        {"rhat": rhat.ravel(), "ess_bulk": bulk.ravel(), "ess_tail": tail.ravel()}, index=index
    ).assign(variable=var, group=group)


def reference_posterior(
    model: Any,
    x: Any,
    y: Any,
    x_test: Any = None,
    y_test: Any = None,
    *,
    num_chains: int = 4,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    thin: int = 1,
    jit_compile: bool | str = "auto",
    max_tree_depth: int = 10,
    target_accept_prob: float = 0.8,
    init_from: Any = None,
    processes: int | None = None,
    seed: int = 0,
    obs_name: str | None = None,
    rhat_threshold: float = RHAT_THRESHOLD,
    progress: bool = False,
) -> Any:
    """Run NUTS on ``model`` and export the chains like a fit (the reference posterior).

    NUTS (Hoffman & Gelman 2014, Pyro's :class:`~pyro.infer.mcmc.NUTS`) samples
    :math:`p(\\theta \\mid D) \\propto p(\\theta) \\prod_i p(y_i \\mid \\theta, x_i)` of the
    *same* model object, with its own priors: ``model(x, y)`` is called as written, with weight
    draws (an enclosing :func:`~pyro_dropout.local_reparameterization` block is blocked). Each
    chain runs ``num_warmup`` adaptation steps (step size, diagonal mass matrix) and keeps
    ``num_samples`` draws (every ``thin``-th), with one torch thread, in its own process when
    ``processes > 1``; chain ``c`` uses seed ``seed + c``, so the draws do not depend on
    ``processes``.

    The draws are exported by :func:`~pyro_dropout.diagnostics.samples_inference_data`: the
    installed ArviZ line's object with ``num_chains`` chains and the groups of
    :func:`~pyro_dropout.diagnostics.to_inference_data` (posterior predictive, pointwise
    log-likelihood, ``predictions*`` on the test set), plus ``sample_stats.diverging``.

    Convergence is checked in function space (module docs, :func:`predictive_convergence`):
    the attributes ``fn_rhat_max``, ``fn_ess_bulk_min``, ``fn_ess_tail_min``,
    ``num_divergent``, ``accept_rate`` (JSON list per chain), ``chain_wall_s`` and
    ``wall_s`` record it, and a :class:`ReferenceConvergenceWarning` is emitted when
    ``fn_rhat_max > rhat_threshold``.

    Cost: an 8-50-1 tanh BNN on 500 points takes about 1 ms per gradient with Pyro's JIT (the
    default where torch's tracer works); NUTS uses up to ``2**max_tree_depth`` gradients per
    iteration.

    The model's ``torch.nn`` modules (and ``init_from``'s) run in eval mode (``BatchNorm``
    with its running statistics); their modes and buffers are restored afterwards
    (:func:`~pyro_dropout.infer.draws.modes.module_mode`).

    Args:
        model: Pyro model ``model(x, y=None)`` (e.g. :class:`~pyro_dropout.BayesianMLP`).
        x, y: training data (rows = observations).
        x_test, y_test: optional test inputs (and targets); function-space convergence is
            assessed there (on the training inputs without them).
        num_chains: chains (>= 2 for R-hat).
        num_warmup, num_samples, thin: per chain.
        jit_compile: compile the potential energy with ``torch.jit.trace`` (Pyro's option;
            needs a model whose structure does not change between calls). ``"auto"`` (the
            default): where this torch's tracer works (TorchScript is deprecated upstream),
            else uncompiled with one :class:`~pyro_dropout.infer.CompilationWarning`;
            ``True`` then raises ``RuntimeError``. The export's config records what ran.
        max_tree_depth, target_accept_prob: NUTS settings.
        init_from: a fitted guide (any guide callable as ``guide(x, y)``): each chain starts
            from its own draw of it; by default Pyro's ``init_to_uniform``.
        processes: worker processes (default: as many as chains and cores allow; 1 runs the
            chains here, one after the other). Workers are spawned, so the model is pickled:
            by value with cloudpickle where plain pickle fails or where its class is defined in
            a notebook or ``python -c`` (``__main__`` without a file, which a worker cannot
            import); when even that fails, the chains run here one after the other, with a
            warning that says why. A script that calls this needs the
            ``if __name__ == "__main__":`` guard (Python's rule for spawned processes).
        seed: base seed; chain ``c`` uses ``seed + c``, the predictive draws ``seed``.
        obs_name: the observed site (found when omitted).
        rhat_threshold: warn above this function-space R-hat.
        progress: show progress: Pyro's bar for each chain run here; with parallel chains,
            one bar per chain (``tqdm``; widgets in a notebook) and one line per finished
            chain (wall time, divergences, acceptance rate, step size).

    Raises:
        ValueError: bad sizes or settings.
        RuntimeError: ``jit_compile=True`` where torch's tracer does not work.

    Example:
        >>> ref = reference_posterior(model, x, y, x_test=xt, y_test=yt, num_chains=4,
        ...                           num_warmup=500, num_samples=500)  # doctest: +SKIP
        >>> compare({"mcd": idata_mcd, "hmc": ref}, reference=ref)  # doctest: +SKIP
    """
    with _module_mode(model, init_from, mode="eval"):
        for name, v in (("num_chains", num_chains), ("num_samples", num_samples), ("thin", thin)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {v!r}")
        if isinstance(num_warmup, bool) or not isinstance(num_warmup, (int, np.integer)):
            raise ValueError(f"num_warmup must be an integer >= 0; got {num_warmup!r}")
        if num_warmup < 0:
            raise ValueError(f"num_warmup must be an integer >= 0; got {num_warmup!r}")
        check_inputs(x, y, x_test, y_test, num_samples)
        if processes is None:
            processes = min(num_chains, _available_cores())
        if (
            isinstance(processes, bool)
            or not isinstance(processes, (int, np.integer))
            or processes < 1
        ):
            raise ValueError(f"processes must be an integer >= 1; got {processes!r}")
        processes = min(int(processes), int(num_chains))
        jit_compile = _resolve_jit(jit_compile)
        # The data rule of every entry point (pyro_dropout.infer.conform): checked rows, a (N, 1)
        # target of a (N,) site reshaped (else NUTS would sample a (N, N) broadcast likelihood).
        xm, ym, _, _ = conform_data(model, x, y, who="reference_posterior", obs_name=obs_name)
        inits = [
            _init_values(model, init_from, xm, ym, seed + c) if init_from is not None else {}
            for c in range(num_chains)
        ]
        sent = model
        if processes > 1:
            sent, why = _picklable(model)
            if sent is None:
                warnings.warn(
                    f"reference_posterior: running the {num_chains} chains one after the other in "
                    f"this process (processes=1): {why}. Define the model in an importable module "
                    "(a .py file) to run the chains in parallel, or pass processes=1 to silence "
                    "this warning.",
                    UserWarning,
                    stacklevel=2,
                )
                processes, sent = 1, model
        base = {
            "model": sent,
            "args": (xm, ym),
            "num_warmup": int(num_warmup),
            "num_samples": int(num_samples) * int(thin),
            "jit_compile": bool(jit_compile),
            "max_tree_depth": int(max_tree_depth),
            "target_accept_prob": float(target_accept_prob),
            "default_dtype": torch.get_default_dtype(),
            "validation": is_validation_enabled(),
            "progress": bool(progress),
            "progress_queue": bool(progress) and processes > 1,
        }
        specs = [
            {**base, "seed": seed + c, "chain": c, "init_values": inits[c]}
            for c in range(num_chains)
        ]
        start = time.perf_counter()
        if processes == 1:
            runs = [_run_chain(s) for s in specs]
        else:
            runs = _run_parallel(specs, processes, bool(progress))
        wall = time.perf_counter() - start

        names = list(runs[0]["samples"])
        samples = {k: torch.cat([r["samples"][k][::thin] for r in runs], 0) for k in names}
        diverging = np.zeros((num_chains, int(num_samples)), dtype=bool)
        for c, r in enumerate(runs):
            kept = [
                i // thin for i in r["divergences"] if i % thin == 0 and i // thin < num_samples
            ]
            diverging[c, kept] = True
        config = {
            "num_chains": int(num_chains),
            "num_warmup": int(num_warmup),
            "num_samples": int(num_samples),
            "thin": int(thin),
            "jit_compile": bool(jit_compile),
            "max_tree_depth": int(max_tree_depth),
            "target_accept_prob": float(target_accept_prob),
            "init_from": None if init_from is None else type(init_from).__name__,
            "seed": int(seed),
        }
        attrs = {
            "inference": "mcmc",
            "num_divergent": int(sum(len(r["divergences"]) for r in runs)),
            "accept_rate": json.dumps([r["accept_rate"] for r in runs]),
            "step_size": json.dumps([r["step_size"] for r in runs]),
            "chain_wall_s": json.dumps([r["wall_s"] for r in runs]),
            "wall_s": float(wall),
            "processes": int(processes),
        }
        data = samples_inference_data(
            model,
            samples,
            x,
            y,
            x_test,
            y_test,
            num_chains=num_chains,
            obs_name=obs_name,
            family="NUTS",
            config=config,
            sample_stats={"diverging": diverging},
            attrs=attrs,
            seed=seed,
        )
        if num_chains >= 2:
            conv = predictive_convergence(data)
            fn: dict[str, float | str] = {
                "fn_rhat_max": float(conv["rhat"].max()),
                "fn_ess_bulk_min": float(conv["ess_bulk"].min()),
                "fn_ess_tail_min": float(conv["ess_tail"].min()),
                "fn_convergence_variable": f"{conv['group'].iloc[0]}.{conv['variable'].iloc[0]}",
            }
            at = conv["rhat"].idxmax()
            at = at if isinstance(at, tuple) else (at,)
            worst = ", ".join(f"{n} {v}" for n, v in zip(conv.index.names, at, strict=True))
        else:
            fn = {"fn_rhat_max": float("nan"), "fn_ess_bulk_min": float("nan")}
            fn["fn_ess_tail_min"] = float("nan")
            fn["fn_convergence_variable"] = "undefined: one chain"
        compat.update_root_attrs(data, fn)
        if not float(fn["fn_rhat_max"]) <= rhat_threshold:
            reason = (
                "one chain: R-hat is undefined, run num_chains >= 2"
                if num_chains < 2
                else f"the largest function-space R-hat is {fn['fn_rhat_max']:.3f} "
                f"> {rhat_threshold} ({fn['fn_convergence_variable']} at {worst}): the chains "
                "disagree about the predictions; run more warm-up and draws, or more chains "
                "(predictive_convergence(data) lists every point)"
            )
            warnings.warn(
                f"reference posterior not converged: {reason}",
                ReferenceConvergenceWarning,
                stacklevel=2,
            )
        return data

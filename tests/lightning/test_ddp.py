"""Two DDP processes on CPU (gloo) against one process on the union of their minibatches."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="needs the lightning extra: pip install -e '.[lightning]'")

from pyro_dropout.lightning import BayesianModule  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _problem import FixedNoise, make_problem  # noqa: E402

WORKER = Path(__file__).with_name("_ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One two-process run (the slow part: process start-up), shared by the tests below."""
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out), "meanfield"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # fail instead of hanging if a rank never joins
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in (0, 1)]


def test_two_ranks_average_to_the_union_gradient(ddp_run):
    r0, r1 = ddp_run
    # The ranks saw disjoint rows (DistributedSampler), 8 each, of the 64.
    assert r0["batch"][0].shape[0] == r1["batch"][0].shape[0] == 8
    rows0 = {tuple(r.tolist()) for r in r0["batch"][0]}
    assert not rows0 & {tuple(r.tolist()) for r in r1["batch"][0]}

    _, _, _, model, guide = make_problem("meanfield")
    module = BayesianModule(model, guide, example=r0["batch"], lr=0.0)
    module.load_state_dict(r0["state"])  # DDP's (broadcast) parameters; lr=0 kept them
    union = [torch.cat([a, b]) for a, b in zip(r0["batch"], r1["batch"], strict=True)]
    with FixedNoise():
        loss, data, kl = module.elbo_terms(union, num_data=64)  # one process, 16 rows, 64/16
    loss.backward()
    ref = {n: p.grad for n, p in module.named_parameters()}
    assert set(ref) == set(r0["grads"]) and len(ref) >= 4
    for name, g in ref.items():
        # DDP averaged the same gradient into both ranks ...
        torch.testing.assert_close(r0["grads"][name], r1["grads"][name], rtol=0, atol=0)
        # ... which is the one-process gradient on the union (float64: 1e-6 is loose).
        torch.testing.assert_close(r0["grads"][name], g, rtol=1e-6, atol=1e-12)
    # The data term matters in this comparison (a wrong N/b would change the gradient).
    assert abs(data.item()) > 0.1 * abs(kl.item())


def test_ranks_draw_different_noise(ddp_run):
    r0, r1 = ddp_run
    n0, n1 = r0["noise"], r1["noise"]
    assert n0.shape == n1.shape == (4, 1)
    assert (n0 - n1).abs().min() > 1e-6

"""``tools/gpu_uci.sh``, the device session's UCI runner, dry-run on the CPU: its rows land in
the result folder of their depth and guide, the units name the commit given, come back in
``$OUT/results.tar`` with their paths under ``results/`` (the device tool returns nothing more
than two folders below ``$OUT``), and a second session resumes (writes nothing new); a phase
the deadline stops comes back as its checkpoint, which the next call resumes."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ._uci import UCI_DIR

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_uci.sh"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path, items, commit=COMMIT, **extra):
    env = dict(
        os.environ,
        OUT=str(tmp_path / "out"),
        RESULTS=str(tmp_path / "results"),
        UCI_ARGS="--quick --threads 1",
        PY=sys.executable,
        DEADLINE_S="300",
    )
    env.update(extra)
    env.pop("PYRO_DROPOUT_COMMIT", None)
    if commit:
        env["PYRO_DROPOUT_COMMIT"] = commit
    return subprocess.run(
        ["bash", str(SCRIPT), items], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_rows_land_in_their_folders_name_the_commit_and_resume(tmp_path, data_dir):
    assert data_dir == UCI_DIR  # the script reads ../shared/data/uci beside the checkout
    run = _run(tmp_path, "yacht:dropout:1:2 yacht:dropout-hetero:2:2")
    assert run.returncode == 0, run.stdout + run.stderr
    with tarfile.open(tmp_path / "out" / "results.tar") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    back = tmp_path / "back" / "results"
    one = back / "uci-full" / "units" / "yacht" / "dropout" / "split_0.json"
    two = back / "uci-2layer" / "units" / "yacht" / "dropout-hetero" / "split_1.json"
    assert one.is_file() and two.is_file(), run.stdout
    unit = json.loads(one.read_text())
    assert unit["code"] == {"commit": COMMIT, "dirty": None}
    assert json.loads(two.read_text())["settings"]["hidden_layers"] == 2
    # the same files in the result folders the run resumes from
    assert (tmp_path / "results" / "uci-full" / "units" / "yacht" / "dropout").is_dir()

    shutil.rmtree(tmp_path / "out")
    again = _run(tmp_path, "yacht:dropout:1:2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not (tmp_path / "out" / "results.tar").exists()  # every unit was there: none written


def test_a_phase_the_deadline_stops_comes_back_as_its_checkpoint_and_resumes(tmp_path):
    """The deadline's SIGTERM (``timeout``) stops a phase mid-training: its checkpoint, and no
    unit, comes back in results.tar, and the next call resumes that phase from it."""
    # a phase far longer than the deadline: always stopped mid-training (30 s: the setup
    # and the imports take ~10 s of it here, the training started well before its end)
    slow = dict(UCI_ARGS="--quick --threads 1 --epochs 100000", MIN_START_S="1")
    run = _run(tmp_path, "yacht:dropout:1:2", DEADLINE_S="30", **slow)
    log = (tmp_path / "out" / "uci_yacht_dropout_1.log").read_text()
    assert "SIGTERM: training checkpointed at step" in log, run.stdout + log
    with tarfile.open(tmp_path / "out" / "results.tar") as tar:
        names = tar.getnames()
    assert names, run.stdout
    assert all(n.startswith("results/uci-full/checkpoints/yacht/dropout/") for n in names), names
    assert any(n.endswith(".pt") for n in names), names

    shutil.rmtree(tmp_path / "out")
    again = _run(tmp_path, "yacht:dropout:1:2", DEADLINE_S="30", **slow)
    log = (tmp_path / "out" / "uci_yacht_dropout_1.log").read_text()
    assert "resuming from" in log, again.stdout + log


def test_refuses_to_run_without_the_commit(tmp_path):
    run = _run(tmp_path, "yacht:dropout:1", commit=None)
    assert run.returncode == 2
    assert "PYRO_DROPOUT_COMMIT" in run.stdout
    assert not (tmp_path / "results").exists()

#!/usr/bin/env bash
# A manual check below the declared floor (issue 38; not run by .ci/run, whose torch versions
# are what pyproject.toml declares: >= 2.13): an older torch, installed from PyPI with
# the NumPy it needs (torch < 2.3 was built against NumPy 1: numpy<2), on Python 3.11, and a fast
# subset of the suite (not the slow tests). Usage: .ci/floor.sh [torch version, default 2.1.2]
#
# Cost: PyPI's Linux torch wheels are CUDA builds and pull the nvidia-* libraries even on a CPU
# machine (without them `import torch` fails: libcublas not found). torch 2.1.2 for cp311 is a
# 670 MB wheel plus ~2.0 GB of nvidia-* and triton wheels; measured here (2026-11-28, a host
# under load 14-18): 12 min 46 s to download and install them, a 4.7 GB venv, then 4 min for
# the project's own dependencies, and the subset below ~9 min. PIP_CACHE_DIR keeps repeat runs
# off the network. At 2.1.2 the subset passes (108 tests, one skipped: Adam's
# decoupled_weight_decay is newer); CPU fused Adam arrived in torch 2.4, before which
# FusedOptim uses foreach.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
torch_version=${1:-2.1.2}
work=$(mktemp -d "${TMPDIR:-/tmp}/pyro-dropout-floor.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1

start=$SECONDS
echo "=== [floor] torch==$torch_version, numpy<2, $(python3.11 --version)"
python3.11 -m venv "$work/venv"
py="$work/venv/bin/python"
printf 'torch==%s\nnumpy<2\n' "$torch_version" >"$work/constraints.txt"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q -c "$work/constraints.txt" "torch==$torch_version" "numpy<2"
"$py" -m pip install -q -c "$work/constraints.txt" -e "$root[test]"
"$py" - <<'PY'
import numpy, pyro, torch
print(f"torch {torch.__version__}, numpy {numpy.__version__}, pyro {pyro.__version__}")
PY
echo "=== [floor] installed in $((SECONDS - start)) s"

# The fast subset, the files run at 2.1.2 so far: fit (compiled path, CompiledSVI, arguments),
# predict, the optimiser, and the durability checks of issue 38. Widen it as more files are run there.
OMP_NUM_THREADS=1 "$py" -m pytest -q -m "not slow" -p no:cacheprovider \
  tests/infer/test_durable.py \
  tests/infer/test_fused_optim.py \
  tests/infer/test_compiled_svi.py \
  tests/infer/test_jit_elbo.py \
  tests/infer/test_fit.py \
  tests/infer/test_predict.py
echo "=== [floor] passed in $((SECONDS - start)) s"

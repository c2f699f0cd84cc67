#!/bin/bash
# One prepared call on a GPU machine (the device tool): the CUDA tests, the UCI projection of
# one large dataset with the batched members on the GPU, and the speed benchmark there.
# Expects: the wheels of pyro-ppl/pyro-api/arviz 1.x in .whl, the UCI data in .gpu_data/uci,
# PYRO_DROPOUT_COMMIT set to the commit copied, $OUT for what comes back.
set -u
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .gpu_site .whl/*.whl && export PYTHONPATH=$PWD/.gpu_site:$PWD || exit 1
mkdir -p ../shared/data && ln -sfn "$PWD/.gpu_data/uci" ../shared/data/uci
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, pyro, arviz; print(torch.__version__, pyro.__version__, arviz.__version__)" \
    >> "$OUT/gpu.txt" 2>&1
echo "== CUDA tests ($(( $(date +%s) - t0 )) s)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/cuda 2>&1 | tee "$OUT/cuda_tests.log" | tail -15
echo "== UCI projection on the GPU ($(( $(date +%s) - t0 )) s)"
timeout 150 python3 -m benchmarks.uci --data-dir ../shared/data/uci \
    --out .gpu_uci_est --estimate --device cuda --datasets kin8nm \
    --guides dropout,meanfield,vd,concrete 2>&1 | tail -8
cp .gpu_uci_est/projection.json "$OUT/uci_projection_cuda.json" 2>/dev/null
echo "== speed benchmark on the GPU ($(( $(date +%s) - t0 )) s)"
timeout 200 python3 -m benchmarks.speed --device cuda --rounds 3 --no-profile \
    --json "$OUT/speed_cuda.json" > "$OUT/speed_cuda.md" 2>&1
tail -30 "$OUT/speed_cuda.md"
echo "== done ($(( $(date +%s) - t0 )) s)"

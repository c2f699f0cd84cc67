#!/usr/bin/env bash
# The GPU checks of one device session, as one script (run in the repository root on a machine
# with a CUDA GPU; writes what it measured under $OUT). Carry `.whl` and `.devdata` (see
# tools/gpu/setup.sh, which installs and records the machine).
# Each phase has its own time limit so that a slow one leaves the others their time.
# DIAG=2 runs tools/gpu/seqtime.py and tools/gpu/interleave.py instead (see docs/benchmarks/speed.md).
set -u
source tools/gpu/setup.sh

if [ "${DIAG:-0}" = 2 ]; then  # the speed methods one by one, then interleaved with labels
    timeout 120 python3 tools/gpu/seqtime.py "$OUT/speed_cuda_seq" > "$OUT/seqtime.log" 2>&1
    echo "seqtime rc $?"; tail -45 "$OUT/seqtime.log"
    for subset in graphs all; do
        timeout 70 python3 tools/gpu/interleave.py $subset 2>&1 | tee "$OUT/interleave_$subset.log" | grep -vE "^\s" | tail -4
    done
    exit 0
fi
echo "== tests/cuda"
timeout "${TESTS_S:-170}" python3 -m pytest -q -p no:cacheprovider tests/cuda -s \
    2>&1 | tee "$OUT/cuda_tests.log" | grep -E "passed|failed|error|FAIL|graph|last" | tail -30

echo "== probe"; timeout 60 python3 tools/gpu/failed_capture_probe.py 2>&1 | tee "$OUT/probe.log"
echo "== speed (CUDA)"
timeout "${SPEED_S:-240}" python3 -m benchmarks.speed --device cuda --no-profile \
    --rounds "${ROUNDS:-5}" --json "$OUT/speed_cuda.json" --markdown "$OUT/speed_cuda.md" \
    > "$OUT/speed_cuda.log" 2>&1
echo "rc $?"; head -40 "$OUT/speed_cuda.md" 2>/dev/null || tail -20 "$OUT/speed_cuda.log"

echo "== batched UCI (kin8nm)"
timeout "${UCI_S:-90}" python3 -m benchmarks.graph_uci --data-dir ../shared/data/uci \
    --dataset kin8nm --split-batch 20 --steps 300 --rounds 3 --json "$OUT/graph_uci.json" \
    > "$OUT/graph_uci.md" 2> "$OUT/graph_uci.log"
echo "rc $?"; cat "$OUT/graph_uci.md"; tail -5 "$OUT/graph_uci.log"

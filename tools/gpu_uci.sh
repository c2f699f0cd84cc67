#!/usr/bin/env bash
# Issue 40's UCI rows on a GPU, resumable from one device session to the next. Run in the
# repository root of a device machine, the tree a clean checkout of the commit it names; carry
# `.whl` and `.devdata` holding the datasets named (tools/gpu/setup.sh):
#
#   PYRO_DROPOUT_COMMIT=<hash> DEADLINE_S=540 bash tools/gpu_uci.sh \
#       "power-plant:dropout-hetero:2 naval-propulsion-plant:dropout-hetero:1:20"
#
# (<hash>: `git rev-parse HEAD` of the clean tree, written out: the device tool's copy has no
# git.) Each item is dataset:guide:hidden-layers[:split-batch (default 10)]. The rows run in order
# with `--device cuda --cuda-graph --resume` into the committed result folders
# (results/uci-2layer for two layers, results/uci-hetero for a heteroscedastic guide, else
# results/uci-full), so units already committed, this CPU's included, are skipped and a row
# goes on where the last session stopped. Units are written as each split batch finishes:
# the deadline loses only the batch in flight (a validation phase's units, split_<k>.val.json,
# come back even when its final phase does not finish: the CPU can take the row on from them).
# Every unit written, and the checkpoint of a phase the deadline stopped, come back in
# $OUT/results.tar with their paths under results/ (the device tool returns no file more than
# two folders below $OUT), the logs beside it: `tar -xf results.tar` in the checkout, check,
# commit the units (git ignores checkpoints/). A phase stopped by the deadline resumes on the
# GPU: at once on the same warm machine (its ignored files stay), or on a fresh one that
# carries results/<folder>/checkpoints. Measured (2026-11-30, one H200, commit 6298f52): the
# kin8nm two-layer MC dropout row, 20 splits as one batch, 381 s; naval's validation phase
# (240 members) 330 s.
# (The device's copy of the tree has no git: the units name the commit through
# PYRO_DROPOUT_COMMIT, benchmarks/_provenance.py, with "dirty": null.)
# For a dry run elsewhere: RESULTS (folder of the result folders), UCI_ARGS (in place of the
# device options), PY (the interpreter) and MIN_START_S (a row starts only with more than this
# many seconds left; default 60, the device runs' margin, not measured) may be set.
set -u
[ -n "${PYRO_DROPOUT_COMMIT:-}" ] || { echo "set PYRO_DROPOUT_COMMIT to the clean commit this tree is"; exit 2; }
[ $# -eq 1 ] || { echo "usage: bash tools/gpu_uci.sh \"dataset:guide:layers[:split-batch] ...\""; exit 2; }
deadline=$(($(date +%s) + ${DEADLINE_S:-540}))
source tools/gpu/setup.sh
OUT=$(cd "$OUT" && pwd)  # (absolute: the copy-back below runs in the result folder)
marker="$OUT/.start"
touch "$marker"
for item in $1; do
    IFS=: read -r ds guide layers batch <<< "$item"
    results=${RESULTS:-results}
    if [ "$layers" = 2 ]; then out=$results/uci-2layer
    elif [ "${guide%-hetero}" != "$guide" ]; then out=$results/uci-hetero
    else out=$results/uci-full; fi
    left=$((deadline - $(date +%s)))
    [ "$left" -gt "${MIN_START_S:-60}" ] || { echo "== $item: not started (${left} s left)"; continue; }
    echo "== $item -> $out (${left} s left)"
    # shellcheck disable=SC2086  # UCI_ARGS: several options
    timeout "$left" "${PY:-python3}" -m benchmarks.uci --data-dir ../shared/data/uci --out "$out" \
        --datasets "$ds" --guides "$guide" --hidden-layers "$layers" \
        --split-batch "${batch:-10}" --resume ${UCI_ARGS:---device cuda --cuda-graph} \
        > "$OUT/uci_${ds}_${guide}_${layers}.log" 2>&1
    echo "rc $?"; grep -E "steps in|splits \[|Error" "$OUT/uci_${ds}_${guide}_${layers}.log" | tail -12
done
results=${RESULTS:-results}
# (and the checkpoint of a phase the deadline stopped: a next call on this machine, or one
# that carries the checkpoints folder, resumes it on the GPU; a CPU refuses a GPU's checkpoint)
(cd "$results" && find . \( -path '*/units/*' -o -path '*/checkpoints/*' \) -type f \
    -newer "$marker") > "$OUT/written.txt"
if [ -s "$OUT/written.txt" ]; then
    tar -cf "$OUT/results.tar" -C "$results" --transform 's|^\./|results/|' -T "$OUT/written.txt"
fi
echo "== units (and checkpoints) written"; sed 's|^\./|results/|' "$OUT/written.txt"

# Sourced by the device scripts (tools/gpu_check.sh, tools/gpu_uci.sh), run in the repository
# root of a device machine: installs the carried wheels into .gpu_site, puts the carried UCI
# data where the scripts look for it, and records the machine in $OUT/machine.txt. Expects,
# carried beside the tree:
#   .whl/      wheels of what the machine lacks (pyro-ppl, pyro-api, ArviZ 1.x and its
#              pure-Python parts);
#   .devdata/  a copy of (part of) ../shared/data/uci (the shared folder does not travel).
OUT=${OUT:-.gpu_out}  # (the device tool sets $OUT; relative to the repository otherwise)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if "${PY:-python3}" -c "import pyro, arviz" 2> /dev/null; then
    export PYTHONPATH=$PWD  # (a machine that has them: nothing to install)
else
    "${PY:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target .gpu_site .whl/*.whl || exit 1
    export PYTHONPATH=$PWD/.gpu_site:$PWD
fi
if [ ! -d ../shared/data/uci ]; then
    mkdir -p ../shared/data && cp -r .devdata/uci ../shared/data/uci
fi
{
    nvidia-smi -L
    "${PY:-python3}" -c "import sys, torch, pyro, numpy; print(sys.version.split()[0], torch.__version__, torch.version.cuda, pyro.__version__, numpy.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

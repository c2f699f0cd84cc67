#!/usr/bin/env bash
# Mutation testing of pyro_dropout/distributions, handlers and guides with mutmut (not in CI).
# See docs/mutation.md. Needs an environment where pyro_dropout is NOT installed in editable
# mode (mutmut imports the mutated copy under mutants/), e.g.:
#   python3 -m venv .venv-mutmut && . .venv-mutmut/bin/activate   # any venv outside the package
#   pip install torch==2.13.0 ".[test]" mutmut && pip uninstall -y pyro-dropout
#   bash tools/mutation.sh            # about an hour on 2 cores
# The configuration (files, tests, message lines left alone) is [tool.mutmut] in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
if python -m pip show pyro-dropout >/dev/null 2>&1; then
  echo "pyro-dropout is installed here: the tests would import it, not the mutated copy." >&2
  echo "Use an environment without it (see the header of this script)." >&2
  exit 1
fi
mutmut run --max-children "${JOBS:-2}" "$@"
python tools/mutation_report.py --out "${REPORT:-mutation-report.md}"

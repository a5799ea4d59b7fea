#!/usr/bin/env bash
# Install lab with its test extras, then run the test suite (what .ci/run calls).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
# before install.sh: it builds the C++ CPU kernels into $LAB_CACHE_DIR, where the tests load them
export LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/models}
scripts/install.sh test
# the example plug-in (a package outside lab): the tests run its options through run.py and LLM
"${PYTHON:-python3}" -m pip install --quiet --no-deps --no-build-isolation -e examples/plugin
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}  # derandomized: see tests/conftest.py
# Two pytest-xdist workers (a test extra): about half the wall time on a 2-core machine for ~10%
# more CPU (each worker imports torch and collects the suite). --dist loadfile keeps a file's
# module-scoped engines and references in one worker. PYTEST_WORKERS=0: one process.
workers=()
if [ "${PYTEST_WORKERS:-2}" != 0 ] && "${PYTHON:-python3}" -c "import xdist" 2>/dev/null; then
  workers=(-n "${PYTEST_WORKERS:-2}" --dist loadfile)
fi
# --durations=15: the slowest 15 tests close the report (the README's Tests section has the budget)
exec "${PYTHON:-python3}" -m pytest tests -m "not slow" -q --durations=15 \
  ${workers[@]+"${workers[@]}"} "$@"

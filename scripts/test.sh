#!/usr/bin/env bash
# Install lab with its test extras, then run the test suite (what .ci/run calls).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh test
export LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/models}
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}  # derandomized: see tests/conftest.py
# --durations=15: the slowest 15 tests close the report (the README's Tests section has the budget)
exec "${PYTHON:-python3}" -m pytest tests -m "not slow" -q --durations=15 "$@"

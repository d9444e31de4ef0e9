#!/usr/bin/env bash
# Run the whole test suite (sets everything up on first run, including chromium for the browser test).
# TensorRT tests are marked `tensorrt` and skip where TensorRT is missing.
# Tests run on 2 pytest-xdist workers (MIXPREC_TEST_WORKERS=0: in this process), each test file on one
# worker, the browser tests on one worker, the scale tests on one worker, the longest groups first
# (tests/conftest.py; --no-loadscope-reorder keeps that order instead of sorting groups by test count).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh --browser
# all of tests/ unless a path is given: `./test.sh -m e2e` (a marker), `./test.sh tests/unit` (a level)
paths=(tests)
for a in "$@"; do [[ $a != -* && -e ${a%%::*} ]] && paths=(); done
exec .venv/bin/python -m pytest -q -rs -n "${MIXPREC_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "${paths[@]}" "$@"

#!/usr/bin/env bash
# Run the whole test suite (sets everything up on first run, including chromium for the browser test).
# TensorRT tests are marked `tensorrt` and skip where TensorRT is missing.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh --browser
exec .venv/bin/python -m pytest -q -rs tests "$@"

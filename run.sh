#!/usr/bin/env bash
# Start the mixprec dashboard (sets everything up on first run).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m streamlit run app.py "$@"

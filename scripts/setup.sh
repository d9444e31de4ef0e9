#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a venv in .venv with the pinned requirements.
# torch is pinned on the command line and in requirements.txt (==2.13.0: a CPU build from local disk here;
# an unpinned torch would pull a several-GB CUDA build).
# With --browser it also installs Debian's chromium for the real-browser test.
# requirements.txt includes Ray (ray==2.60.0), an optional dependency: only --ray / MIXPREC_RAY_ADDRESS
# (trials on a Ray cluster, docs/distributed.md) imports it; without it mixprec uses local worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
browser=""  # Debian's chromium installs in the background while pip installs (the two wait on different things)
if [ "${1:-}" = "--browser" ] && [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  ( $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null ) &
  browser=$!
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.mixprec-requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0" -r requirements.txt  # one resolution, torch pinned in it
  echo "$want" > "$stamp"
fi
if [ -n "$browser" ] && ! wait "$browser"; then
  echo "scripts/setup.sh: installing Debian's chromium failed (apt-get install chromium): the browser tests need it" >&2
  exit 1
fi

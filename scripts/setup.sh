#!/usr/bin/env bash
# Create .venv and install the project with its test extras (idempotent; fast when already installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.cowork-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch is pinned to the CPU wheel in pyproject.toml; see README "GPU" to use CUDA.
  # constraints.txt: the exact versions the tests last passed with (transformers, trl, ... move fast).
  .venv/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi

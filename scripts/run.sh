#!/usr/bin/env bash
# Run the main job end to end on the embedded default (offline, CPU): `cowork run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/cowork run "$@"

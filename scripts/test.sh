#!/usr/bin/env bash
# Install what the tests need (Python deps; Chromium for the browser test when apt is available), then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian's chromium for the browser test (skipped quietly where apt is unavailable).
if [ -f scripts/install_browser.sh ]; then bash scripts/install_browser.sh || true; fi
# Azurite (npm) for the Azure cases of the object-store tests (skipped quietly where npm is unavailable).
if [ -f scripts/install_azurite.sh ]; then bash scripts/install_azurite.sh || true; fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Rewrite constraints.txt from what .venv holds now (run after upgrading a dependency and passing the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  sed -n '/^#/p' constraints.txt | head -4
  .venv/bin/python -m pip freeze --exclude-editable | grep -v '^-e\|^#\|^torch=='
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pinned packages"

#!/usr/bin/env bash
# Install Azurite (Microsoft's Azure Storage emulator, from npm) into .cache/azurite for the object-store tests
# (tests/test_object_store.py runs the lake against it as against a local S3 server). Idempotent, and never fails
# the caller: without npm it says so and exits 0, and the Azure cases of those tests skip with that reason.
set -u
cd "$(dirname "$0")/.."

VERSION=3.37.0
DEST=.cache/azurite
BIN=$DEST/node_modules/.bin/azurite-blob

if [ -x "$BIN" ] && grep -q "\"version\": \"$VERSION\"" "$DEST/node_modules/azurite/package.json" 2>/dev/null; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "install_azurite: node and npm are needed to install Azurite; the Azure object-store tests will be skipped" >&2
  exit 0
fi
mkdir -p "$DEST"
if ! npm install --prefix "$DEST" --silent --no-audit --no-fund --no-save "azurite@$VERSION" >/dev/null 2>&1; then
  echo "install_azurite: npm install azurite@$VERSION failed; the Azure object-store tests will be skipped" >&2
  exit 0
fi
echo "install_azurite: azurite $VERSION installed in $DEST" >&2
exit 0

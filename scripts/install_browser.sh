#!/usr/bin/env bash
# Install Debian's chromium for the browser test (tests/test_ui.py), if it is missing and apt-get can be used.
# Idempotent, and never fails the caller: when chromium cannot be installed it says why and exits 0
# (the browser test then skips with that reason). Playwright's own browser download is never used.
set -u

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: $CHROMIUM is missing and apt-get is not available; the browser test will be skipped" >&2
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install_browser: $CHROMIUM is missing and installing it needs root (no passwordless sudo); the browser test will be skipped" >&2
    exit 0
  fi
fi

echo "install_browser: installing Debian chromium (apt-get) ..." >&2
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq; then
  echo "install_browser: apt-get update failed; the browser test will be skipped" >&2
  exit 0
fi
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
  echo "install_browser: apt-get install chromium failed; the browser test will be skipped" >&2
  exit 0
fi
if [ -x "$CHROMIUM" ]; then
  echo "install_browser: $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed" >&2
else
  echo "install_browser: chromium was installed but $CHROMIUM does not exist; the browser test will be skipped" >&2
fi
exit 0

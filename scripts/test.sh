#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh) and runs every test with ctest.
# This is README's second command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)"

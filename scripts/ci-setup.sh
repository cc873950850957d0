#!/usr/bin/env bash
# Installs the system packages the test suite needs. Idempotent; safe to run on every CI run.
set -euo pipefail

# bubblewrap: frognano-sandbox confines commands with it (tests in crates/sandbox need it).
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq bubblewrap
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap
    fi
fi

#!/usr/bin/env bash
# The test command (README): installs what the tests need, then format, lint and test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ci-setup.sh
# Tests that need fetched fixtures (demo model, tokenizer) fail instead of skipping.
export FROGNANO_REQUIRE_FIXTURES=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace

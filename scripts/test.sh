#!/usr/bin/env bash
# The test command (README): installs what the tests need, then format, lint and test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ci-setup.sh
# Tests that need fetched fixtures (demo model, tokenizer) fail instead of skipping.
export FROGNANO_REQUIRE_FIXTURES=1
cargo fmt --all -- --check
# Every CUDA kernel compiles for the GPU (nvcc from PyPI, no GPU needed; docs/gpu.md §4).
./scripts/check-kernels.sh
# libnvrtc from the same wheels, for crates/gpu/tests/nvrtc.rs (NVRTC compiling the kernels as
# a GPU run does; no driver is there, so --device cuda still reports no CUDA).
cuda_root="$(./scripts/setup-cuda-nvcc.sh | tail -1)"
export LD_LIBRARY_PATH="$cuda_root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo clippy --workspace --all-targets -- -D warnings
# fuzz/ is its own workspace (cargo-fuzz, libFuzzer): type-check its target against today's
# frognano-model. In the same target folder it reuses what clippy just checked (fuzz/Cargo.toml
# says how), so it takes seconds; the time is printed so that a slow one shows. Not --locked:
# a new dependency of frognano-model must not fail CI here, so cargo adds it to fuzz/Cargo.lock
# and the line below says the committed lock is behind.
fuzz_start=$SECONDS
cargo check --quiet --manifest-path fuzz/Cargo.toml --no-default-features --target-dir target
echo "fuzz/ type-checked in $((SECONDS - fuzz_start)) s"
git diff --quiet -- fuzz/Cargo.lock 2>/dev/null ||
    echo "note: fuzz/Cargo.lock was behind fuzz/Cargo.toml and cargo updated it; commit the update"
# Every test that cannot run on this machine (a missing CPU feature) appends one
# `SKIPPED (needs …): …` line to this file (frognano_model::test_support::report_skip); cargo
# hides the stderr of passing tests, so the summary below reads the file.
FROGNANO_SKIP_LOG="$(mktemp "${TMPDIR:-/tmp}/frognano-skips.XXXXXX")"
export FROGNANO_SKIP_LOG
# The summary is printed even when a test failed; either failure fails the run.
status=0
cargo test --workspace || status=$?
# Disk left after the build: a clean CI machine once ran out while linking test binaries.
df -h . | tail -1 | awk '{print "disk after tests: " $4 " free of " $2 " (target/: " }' | tr -d '\n'
du -sh target 2>/dev/null | cut -f1 | tr -d '\n'; echo ')'
./scripts/skip-summary.sh "$FROGNANO_SKIP_LOG" || status=1
exit "$status"

#!/usr/bin/env bash
# The test command (README): installs what the tests need, then format, lint and test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step prints how long it took (a clean CI machine must finish in 30 minutes).
step_start=$SECONDS
step() { echo "=== $1 took $((SECONDS - step_start)) s (total $SECONDS s)"; step_start=$SECONDS; }
./scripts/ci-setup.sh
step "setup (scripts/ci-setup.sh)"
# Tests that need fetched fixtures (demo model, tokenizer) fail instead of skipping.
export FROGNANO_REQUIRE_FIXTURES=1
cargo fmt --all -- --check
step "cargo fmt"
# Every CUDA kernel compiles for the GPU (nvcc from PyPI, no GPU needed; docs/gpu.md §4).
./scripts/check-kernels.sh
# libnvrtc from the same wheels, for crates/gpu/tests/nvrtc.rs (NVRTC compiling the kernels as
# a GPU run does; no driver is there, so --device cuda still reports no CUDA).
cuda_root="$(./scripts/setup-cuda-nvcc.sh | tail -1)"
export LD_LIBRARY_PATH="$cuda_root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step "CUDA kernels compiled, NVRTC set up"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo clippy"
# fuzz/ is its own workspace (cargo-fuzz, libFuzzer): FROGNANO_CHECK_FUZZ=1 type-checks its
# target against today's frognano-model. Off by default: on a clean machine it checks most
# dependencies again (6 minutes of a 30-minute budget, session 20), where a warm target folder
# takes seconds; the parser it drives is tested in `cargo test` (tests/gguf_mutation.rs). Not
# --locked: a new dependency of frognano-model must not fail the check, so cargo adds it to
# fuzz/Cargo.lock and the line below says the committed lock is behind.
if [ "${FROGNANO_CHECK_FUZZ:-0}" = 1 ]; then
    cargo check --quiet --manifest-path fuzz/Cargo.toml --no-default-features --target-dir target
    step "fuzz/ type-checked"
    git diff --quiet -- fuzz/Cargo.lock 2>/dev/null ||
        echo "note: fuzz/Cargo.lock was behind fuzz/Cargo.toml and cargo updated it; commit the update"
fi
# Every test that cannot run on this machine (a missing CPU feature) appends one
# `SKIPPED (needs …): …` line to this file (frognano_model::test_support::report_skip); cargo
# hides the stderr of passing tests, so the summary below reads the file.
FROGNANO_SKIP_LOG="$(mktemp "${TMPDIR:-/tmp}/frognano-skips.XXXXXX")"
export FROGNANO_SKIP_LOG
# The summary is printed even when a test failed; either failure fails the run.
status=0
if cargo nextest --version >/dev/null 2>&1; then
    # cargo-nextest (on CI's machines) keeps both cores busy across test binaries and starts the
    # longest tests first (.config/nextest.toml). Examples are left out of this build: clippy
    # above has type-checked them, and they are benchmarks, not tests.
    cargo nextest run --workspace --lib --bins --tests || status=$?
    step "cargo nextest run"
    # nextest does not run documentation examples.
    cargo test --workspace --doc || status=$?
    step "cargo test --doc"
else
    cargo test --workspace || status=$?
    step "cargo test"
fi
# Disk left after the build: a clean CI machine once ran out while linking test binaries.
df -h . | tail -1 | awk '{print "disk after tests: " $4 " free of " $2 " (target/: " }' | tr -d '\n'
du -sh target 2>/dev/null | cut -f1 | tr -d '\n'; echo ')'
./scripts/skip-summary.sh "$FROGNANO_SKIP_LOG" || status=1
exit "$status"

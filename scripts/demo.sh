#!/usr/bin/env bash
# The main job on built-in defaults: build, then run the default model on a short prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p frognano
./target/release/frognano run "${@:-}"

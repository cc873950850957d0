#!/usr/bin/env bash
# The main job on built-in defaults: fetch the demo model (SmolLM2-135M-Instruct, Q4_1), build
# the release binary, and let the coding agent work on the bundled example repository (a tiny
# Python project with a failing test). The agent runs in a separate copy; the patch, the
# trajectory and a summary land in frognano-runs/. A 135M model rarely fixes the bug: pass
# `--model PATH` (a Qwen3.5 / FrogNano checkpoint or GGUF) or `--endpoint URL --model NAME`
# for a real run; extra arguments go to `frognano solve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-demo-model.sh
cargo build --release -p frognano
exec ./target/release/frognano solve --demo --max-steps 6 --max-tokens-per-turn 384 "$@"

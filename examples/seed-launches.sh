#!/usr/bin/env bash
# The three launch commands of the mission's story, checked before any GPU is touched.
#
#   1. a vLLM-style flag: SGLang exits 2 after the user waited for nothing -> invalid, with the flag to use
#   2. the right flag, but steps left out: SGLang stops with a bare AssertionError -> invalid, explained
#   3. steps added: SGLang runs, but silently verifies 2 draft tokens, not 16 -> adjusted, with the fix
#
# Run from the repository root after `make venv sglang-venv` (or `make test`).
set -u
cd "$(dirname "$0")/.."
SPECSWEEP=${SPECSWEEP:-.venv/bin/specsweep}
TARGET=${TARGET:-tests/fixtures/kimi-k2}       # Kimi-K2-shaped config.json (weights not needed)
DRAFT=${DRAFT:-tests/fixtures/eagle3-draft}    # converted EAGLE3 drafter's config.json

base=(--model-path "$TARGET" --tp-size 8 --speculative-algorithm EAGLE3
      --speculative-draft-model-path "$DRAFT" --speculative-eagle-topk 1)

echo "== 1. --num-speculative-tokens 16"
"$SPECSWEEP" validate -- "${base[@]}" --num-speculative-tokens 16
echo "exit code $? (2 = invalid)"

echo; echo "== 2. --speculative-num-draft-tokens 16"
"$SPECSWEEP" validate -- "${base[@]}" --speculative-num-draft-tokens 16
echo "exit code $? (2 = invalid)"

echo; echo "== 3. --speculative-num-draft-tokens 16 --speculative-num-steps 1"
"$SPECSWEEP" validate -- "${base[@]}" --speculative-num-draft-tokens 16 --speculative-num-steps 1
echo "exit code $? (3 = adjusted: SGLang changes a value you gave)"

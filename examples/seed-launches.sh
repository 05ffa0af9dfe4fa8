#!/usr/bin/env bash
# The three launch commands of the mission's story, checked before any GPU is touched.
#
#   1. a vLLM-style flag: SGLang exits 2 after the user waited for nothing -> invalid, with the flag to use
#   2. the right flag, but steps left out: SGLang stops with a bare AssertionError -> invalid, explained
#   3. steps added: SGLang runs, but silently verifies 2 draft tokens, not 16 -> adjusted, with the fix
#
# Runs from any directory once specsweep is installed (`make venv sglang-venv` in the repository, or
# `specsweep` on PATH). Exits 1 when a launch's verdict is not the one above, 2 when specsweep is missing.
# SPECSWEEP, TARGET and DRAFT override the command and the two config directories.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPECSWEEP=${SPECSWEEP:-$(command -v specsweep || echo "$repo/.venv/bin/specsweep")}
TARGET=${TARGET:-$repo/tests/fixtures/kimi-k2}       # Kimi-K2-shaped config.json (weights not needed)
DRAFT=${DRAFT:-$repo/tests/fixtures/eagle3-draft}    # converted EAGLE3 drafter's config.json
if ! [ -x "$SPECSWEEP" ] && ! command -v "$SPECSWEEP" > /dev/null; then
    echo "seed-launches.sh: specsweep not found at $SPECSWEEP; fix: run 'make venv sglang-venv' in $repo," \
        "or set SPECSWEEP to the command" >&2
    exit 2
fi

base=(--model-path "$TARGET" --tp-size 8 --speculative-algorithm EAGLE3
      --speculative-draft-model-path "$DRAFT" --speculative-eagle-topk 1)

# expect CODE MEANING ARGS...: validate one launch and stop the script unless its exit code is CODE
expect() {
    local want=$1 meaning=$2 got=0
    shift 2
    "$SPECSWEEP" validate -- "${base[@]}" "$@" || got=$?
    echo "exit code $got ($want = $meaning)"
    if [ "$got" -ne "$want" ]; then
        echo "seed-launches.sh: expected exit code $want ($meaning), got $got" >&2
        exit 1
    fi
}

echo "== 1. --num-speculative-tokens 16"
expect 2 "invalid" --num-speculative-tokens 16

echo; echo "== 2. --speculative-num-draft-tokens 16"
expect 2 "invalid" --speculative-num-draft-tokens 16

echo; echo "== 3. --speculative-num-draft-tokens 16 --speculative-num-steps 1"
expect 3 "adjusted: SGLang changes a value you gave" --speculative-num-draft-tokens 16 --speculative-num-steps 1

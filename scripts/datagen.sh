#!/usr/bin/env bash
# The long on-policy data job of issue 18: the default target's greedy responses to >8,000 prompts
# (MT-bench both turns, HumanEval, summaries, every BFCL category, reasoning-gym's generators), the
# benchmark's held-out prompts excluded; --dtype gguf-exact gives the fp32 bits, faster. Resumable: rerun
# the same command after an interruption. One worker per core: add `--part 0/2` and `--part 1/2`.
#   bash scripts/datagen.sh OUT_DIR [extra `train data` options]
set -euo pipefail
out=${1:?usage: scripts/datagen.sh OUT_DIR}
shift
exec python3 -m specdecode train data --out "$out" \
    --prompts mtbench,mtbench2,humaneval,summaries,bfclall,reasoning:40 --exclude heldout:2,mtbench:1 \
    --max-prompt-tokens 1024 --max-new-tokens 256 --batch 8 --threads 1 --dtype gguf-exact \
    --shard-size 128 --flush-minutes 10 "$@"

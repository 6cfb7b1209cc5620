#!/usr/bin/env bash
# Issue 18's training recipe on one data directory: the EAGLE-3 head, the Medusa heads and the distilled
# draft, one after another, with the target features computed once into OUT/features and shared. Each
# trainer checkpoints every 100 steps; rerun the same command after an interruption: a trainer with a
# checkpoint in its directory resumes, a finished one (losses.json written) is skipped.
#   bash scripts/train_drafters.sh DATA_DIR OUT_DIR [extra options for every trainer, e.g. --threads 2]
# Schedules (steps of 1,024 tokens) from the environment: EAGLE_STEPS (6000, the shipped head's),
# MEDUSA_STEPS (3000), DRAFT_STEPS (3000). bf16 autocast: leave it on where the CPU has bf16 dot
# products (AVX512-BF16, AMX); AMP=fp32 otherwise. VAL=0.02: hold 2% of the sequences out, score each
# drafter there every 200 steps, keep the best in OUT/KIND/best, and stop after PATIENCE (5) scores
# without a better one.
set -euo pipefail
data=${1:?usage: scripts/train_drafters.sh DATA_DIR OUT_DIR [options]}
out=${2:?usage: scripts/train_drafters.sh DATA_DIR OUT_DIR [options]}
shift 2
mkdir -p "$out"
train() {  # kind steps lr [kind's options...]
    local kind=$1 steps=$2 lr=$3 dir="$out/$1"
    shift 3
    if [ -f "$dir/losses.json" ]; then echo "$kind: done ($dir)"; return; fi
    local resume=() val=()
    [ -f "$dir/train_state.pt" ] && resume=(--resume)
    [ -n "${VAL:-}" ] && val=(--val "$VAL" --patience "${PATIENCE:-5}")
    python3 -m specdecode train "$kind" --data "$data" --features "$out/features" --out "$dir" --steps "$steps" \
        --lr "$lr" --amp "${AMP:-bf16}" --save-every 100 "${resume[@]}" "${val[@]}" "$@"
}
train eagle "${EAGLE_STEPS:-6000}" 3e-3 --set ttt_steps=3 "$@"
train medusa "${MEDUSA_STEPS:-3000}" 5e-3 "$@"
train draft "${DRAFT_STEPS:-3000}" 1e-3 "$@"

